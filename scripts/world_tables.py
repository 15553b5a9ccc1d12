"""
The tables run.sh prints at the end of its worlds (tasks, stdlib), read from the JSON the worlds' runs write; run.sh
real's is in scripts/conversion.py. scripts/report.py dispatches to them:

    python -m scripts.report tasks_world ar ar-dpo dlm align0 align ...    # out/tasks/results.md
    python -m scripts.report stdlib_world ar-tiny dlm-tiny align ...       # out/results.md
"""
import json
from pathlib import Path


def split(r):
    """'N 6; 1.80 + 0.40': a tasks run's canvas and its mean forwards a row, committing answer tokens + only after."""
    return f"N {r['canvas']}; {r['forwards_answer']:.2f} + {r['forwards_after']:.2f}"


def tasks_world(*args):
    """run.sh: the exact-answer world's table (out/tasks/results.md). args: the model names."""
    argv = ["tasks_world", *map(str, args)]
    O = Path("out/tasks")
    what = {"ar": "AR teacher (`pretrain.py`, 1200 steps)", "ar-dpo": "AR after DPO (`dpo.py --sft_weight 1`)",
            "dlm": "bidirectional conversion, untrained", "align0": "masked diffusion, λ = 0 (`align.py`, 200 steps)",
            "align": "REPR-ALIGN, λ = 10 (`align.py`, 200 steps)", "block": "block conversion, untrained",
            "distill-off": "OPDLM, off-policy ablation (`distill.py --policy off`, 200 steps)",
            "distill": "OPDLM (`distill.py`, 200 steps)", "merged": "REPR-ALIGN + AR-MAP (`merge.py merge`)"}
    runs = {m: json.loads((O / f"eval/{m}.json").read_text())["results"]["runs"] for m in argv[1:]}
    merge = json.loads((O / "merged/merge.json").read_text())
    print("Exact match on 100 held-out prompts per family (greedy; an answer ending in the preferred full stop "
          "counts as right), at threshold 0.9 for the DLMs (they commit every token whose confidence reaches it) and "
          "at 0.5; tokens per forward: the mean over rows of each row's own count, on a canvas of N slots, and "
          "each row's forwards split into those that committed answer tokens and those spent only on slots after "
          "the answer.\n")
    print("| model | sort | rev | add | tokens per forward (N; forwards: answer + after) | all, threshold 0.5: exact "
          "match / tokens per forward | with the full stop |")
    print("|---|---|---|---|---|---|---|")
    order = ["ar", "dlm", "align0", "align", "distill-off", "distill", "ar-dpo", "merged"]
    for m in [m for m in order if m in runs]:
        rs = runs[m]
        r = rs[0] if rs[0]["threshold"] is None else next(x for x in rs if x["threshold"] == 0.9)
        lo = next((x for x in rs if x["threshold"] == 0.5), None)
        f = r["families"]
        name = what[m] + (f", γ = {merge['best_gamma']:g} chosen" if m == "merged" else "")
        low = "—" if lo is None else f"{lo['right']:.2f} / {lo['tokens_per_forward']:.2f}"
        print(f"| {name} | {f['sort']['right']:.2f} | {f['rev']['right']:.2f} | {f['add']['right']:.2f} | "
              f"{r['tokens_per_forward']:.2f} ({split(r)}) | {low} | {r['preferred']:.2f} |")
    print("\nAccuracy against parallelism: exact match (all families, a full stop allowed) / tokens per forward "
          "(the DLMs' canvas: N = " + ", ".join(sorted({f"{runs[m][-1]['canvas']} ({m})" for m in runs
                                                       if m not in ("ar", "ar-dpo")})) + ")\n")
    ts = [r["threshold"] for r in runs["align"]]
    print("| model | " + " | ".join(f"threshold {t:g}" for t in ts) + " |")
    print("|---|" + "---|" * len(ts))
    for m, rs in runs.items():
        if m not in ("ar", "ar-dpo"):
            print(f"| {m} | " + " | ".join(f"{r['right']:.2f} / {r['tokens_per_forward']:.2f}" for r in rs) + " |")
    dlms = [m for m in runs if m not in ("ar", "ar-dpo")]
    at = {m: next(x for x in runs[m] if x["threshold"] == 0.9) for m in dlms}
    if all("lengths" in r for r in at.values()):
        print("\nTokens per forward at threshold 0.9 by the answer's length (digits; n prompts)\n")
        print("| family | digits | n | " + " | ".join(dlms) + " |\n|---|---|---|" + "---|" * len(dlms))
        for key, r0 in at["align"]["lengths"].items():
            print(f"| {key.replace('/', ' | ')} | {r0['n']} | "
                  + " | ".join(f"{at[m]['lengths'][key]['tokens_per_forward']:.2f}" for m in dlms) + " |")
    k = merge["gammas"].index(merge["best_gamma"])
    print(f"\nAR-MAP: γ = {merge['best_gamma']:g} chosen on {merge['train']['n_pairs']} training pairs (reward "
          f"accuracy "
          f"{merge['train']['reward_accuracy'][k]:.3f}); held-out reward accuracy "
          f"{merge['heldout']['reward_accuracy'][k]:.3f}")


def stdlib_world(*args):
    """run.sh stdlib: the standard-library world's table (out/results.md). args: the model names."""
    argv = ["stdlib_world", *map(str, args)]
    what = {"ar-tiny": "AR teacher (pretrain.py)", "ar-dpo": "AR after DPO (dpo.py)",
            "dlm-tiny": "converted DLM, untrained (convert.py)", "align0": "masked diffusion, λ = 0 (align.py)",
            "align": "REPR-ALIGN, λ = 10 (align.py)", "dlm-block": "converted block DLM, untrained (convert.py)",
            "distill": "OPDLM block student (distill.py)",
            "dlm-merged": "REPR-ALIGN + AR-MAP (merge.py merge)"}
    merge = json.loads(Path("out/dlm-merged/merge.json").read_text())
    dpo = json.loads(Path("out/ar-dpo/results.json").read_text())
    reward = {"ar-dpo": f"{dpo['heldout_reward_acc']:.3f}",
              "dlm-merged": f"{merge['heldout']['reward_accuracy'][merge['gammas'].index(merge['best_gamma'])]:.3f} "
                            f"(γ = {merge['best_gamma']:g}, chosen on training pairs)"}
    print("| model | likelihood: bits/token (AR: exact; DLM: −ELBO ± s.e.) | masked acc @0.5 | gen. perplexity "
          "(under the teacher) | sample entropy (bits) | tokens per forward | held-out reward accuracy |")
    print("|---|---|---|---|---|---|---|")
    for m in argv[1:]:
        lk = json.loads(Path(f"out/eval/{m}.likelihood.json").read_text())["results"]
        gn = json.loads(Path(f"out/eval/{m}.generate.json").read_text())["results"]
        like = (f"{lk['bits_per_token']:.3f}" if lk["kind"] == "AR" else
                f"{lk['nelbo_bits_per_token']:.3f} ± {lk['stderr']:.3f}")
        acc = f"{lk['acc@0.5']:.3f}" if "acc@0.5" in lk else "—"
        print(f"| {m}: {what[m]} | {like} | {acc} | {gn['gen_perplexity']:.1f} | {gn['unigram_entropy_bits']:.2f} "
              f"| {gn['tokens_per_forward']:.2f} | {reward.get(m, '—')} |")
    print(f"\nAR-MAP win rate of out/dlm-merged over out/align under the rule 'prefer single quotes': "
          f"{merge['win_rate']:.3f} ({merge['samples']} samples each)")


COMMANDS = (tasks_world, stdlib_world)
