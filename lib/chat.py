"""
The terminal side of sampling, for sample.py: a multi-turn chat in a checkpoint's chat template (`session`, its
sampling settings changed by /set: `set_setting`), an AR answer streamed as it is made (`stream_view`), a DLM's answer
redrawn before every forward (`live_view`), the round of its block that committed each token of a block DLM's text
(`show_rounds`), and sample.py's samples and speed (`print_samples`). Nothing here samples: sample.py passes its
sampler, or its Generation, in.
"""
import os
import select
import signal
import sys

from lib import cli

MARKS = "0123456789abcdefghijklmnopqrstuvwxyz"
COLOURS = (32, 33, 34, 35, 36, 31)  # ANSI foreground by round: green, yellow, blue, magenta, cyan, red, again


def token_pieces(tok, ids):
    """The text each token adds to tok.decode(ids): a character whose UTF-8 bytes span several tokens goes to
    the token that completes it. -> a list of strings, one per id, joining to tok.decode(ids)."""
    pieces, done = [], ""
    for i in range(len(ids)):
        text = tok.decode(ids[:i + 1])
        if i < len(ids) - 1:
            text = text.rstrip("\ufffd")  # perhaps a character cut short: the token that completes it gets it
        pieces.append(text[len(done):])
        done = text
    return pieces


def mark(r):
    """The character under a token committed in round r: 0-9, a-z, then +; blank for r < 0 (the prompt)."""
    if r < 0:
        return " "
    if r < len(MARKS):
        return MARKS[r]
    return "+"


def show_rounds(pieces, rounds, *, width=100, colour=False):
    """Text with, under each line, the round that committed each character's token (`mark`); pieces and
    rounds: one string and one round per token, round -1 for prompt tokens. Lines longer than width wrap,
    tabs become four spaces, other control characters a middle dot; a line of prompt alone gets no mark line.
    colour: each generated character also gets its round's ANSI colour (for a terminal)."""
    out, text, marks = [], [], []

    def flush():
        out.append("".join(text).rstrip())
        if any(m != " " for m in marks):
            out.append("".join(marks).rstrip())
        text.clear()
        marks.clear()
    for piece, r in zip(pieces, rounds):
        for ch in piece.replace("\t", "    "):
            if ch == "\n":
                flush()
                continue
            if len(text) == width:
                flush()
            ch = ch if ch.isprintable() else "·"
            m = mark(r)
            if colour and r >= 0:
                paint = f"\x1b[{COLOURS[r % len(COLOURS)]}m"
                ch, m = f"{paint}{ch}\x1b[0m", f"{paint}{m}\x1b[0m"
            text.append(ch)
            marks.append(m)
    flush()
    return "\n".join(out)


def add_args(p):
    """sample.py's flags: the checkpoint, the prompts, the sampler's (cli.sampler_args), the views, seed, device."""
    p.add_argument("--ckpt", required=True, help="a Qwen3 checkpoint directory or Hugging Face model id "
                   "(org/name[@revision]); its config.attn picks the sampler")
    p.add_argument("--prompt", default=None, help="the text to continue (encoded with the checkpoint's tokenizer); "
                   "default 'def ', with --chat: an interactive session")
    p.add_argument("--num_samples", type=int, default=1, help="rows of one batch, all from --prompt")
    p.add_argument("--data", default=None, help="a lib/corpus.py directory: one prompt per row instead, the first "
                   "--num_samples validation documents from their first def (32 tokens)")
    cli.sampler_args(p, 64)
    p.add_argument("--show_rounds", action="store_true",
                   help="block: mark each generated token with the round that committed it (colours on a terminal)")
    p.add_argument("--chat", action="store_true", help="the checkpoint's chat template: --prompt as one user turn, or "
                   "without --prompt a multi-turn session (Ctrl-C ends a turn, Ctrl-D the session)")
    p.add_argument("--seed", type=int, default=1337, help="seeds the sampler's generator (runs repeat exactly)")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")


def prompt_rows(tok, args, attn):
    """sample.py's --num_samples rows of --prompt (default 'def '; --chat: one user turn in the checkpoint's chat
    template), or a one-line exit: a prompt of no tokens, a template that does not render, --show_rounds for a
    checkpoint of attn other than "block"."""
    if args.show_rounds and attn != "block":
        raise SystemExit(f"sample: --show_rounds needs a block-diffusion checkpoint (config.attn 'block'), "
                         f"{args.ckpt} has {attn!r}")
    prompt = "def " if args.prompt is None else args.prompt
    try:
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}]) if args.chat else tok.encode(prompt)
    except ValueError as e:  # no template, or one that does not render
        raise SystemExit(f"sample: --chat: {e}")
    if not ids:
        raise SystemExit("sample: --prompt encodes to no tokens")
    return [ids] * args.num_samples


def print_samples(tok, prompts, gen, sampler, seconds, *, titled=False):
    """sample.py's output: each row of gen (a sample.Generation of the token lists `prompts`) up to its first end
    token, headed by its number or (titled) its prompt; with gen.rounds, in the round view (`show_rounds`, coloured
    on a terminal) and its legend. Then one line: the sampler's name, the seconds, each row's tokens per forward
    (mean, min, max: Generation.tokens_per_forward), forwards a row, and tokens per second."""
    for b, ids in enumerate(prompts):
        n = int(gen.row_tokens[b])  # the sample up to its first eos
        seq = gen.sequence(b)[:len(ids) + n].tolist()
        print(f"--- prompt: {tok.decode(ids)!r}" if titled else f"--- sample {b}")
        if gen.rounds is None:
            print(tok.decode(seq))
        else:
            rounds = [-1] * len(ids) + gen.rounds[b, :n].tolist()
            print(show_rounds(token_pieces(tok, seq), rounds, colour=sys.stdout.isatty()))
    if gen.rounds is not None:
        print("(under each generated character: the round of its block that committed it, 0 = the block's first "
              "forward)")
    tpf, up_to_eos = gen.tokens_per_forward.double(), int(gen.row_tokens.sum()) / seconds
    print(f"{sampler}: {len(prompts)} x {gen.generated.shape[1]} tokens in {seconds:.2f} s; per row "
          f"{tpf.mean():.2f} tokens per forward (min {tpf.min():.2f}, max {tpf.max():.2f}; "
          f"{gen.row_nfe.double().mean():.1f} forwards a row); {up_to_eos:.1f} tokens/s up to eos, "
          f"{gen.generated.numel() / seconds:.1f} raw ({gen.nfe} batched forwards)")


def live_view(tok, P, mask_id, width=100):
    """A forward pre-hook (register_forward_pre_hook(..., with_kwargs=True)) that redraws a terminal's status line
    before each of a sampler's forwards: the answer as it stands from slot P on, ▒ for each slot still masked."""
    canvas = {}

    def hook(module, args, kwargs):
        x, slots = args[0][0].tolist(), kwargs.get("slots")  # row 0; the slots fed (all from 0 without a cache)
        canvas.update(zip(range(len(x)) if slots is None else slots.tolist(), x))
        ids = [canvas[s] for s in sorted(canvas) if s >= P]
        text = "".join("▒" if t == mask_id else p for t, p in zip(ids, token_pieces(tok, ids)))
        sys.stdout.write("\r\x1b[K" + text.replace("\n", "⏎")[-width:])
        sys.stdout.flush()
    return hook


def stream_view(tok, P, ends):
    """A forward pre-hook (as live_view's) for an AR answer: prints each token of the answer as it is fed back
    (the token a forward produced enters the next one), up to the first of the end ids; -> (hook, printed), the
    text printed so far in printed[0]. The last token, never fed, is the caller's to print."""
    ids, printed = [], [""]

    def hook(module, args, kwargs):
        x, slots = args[0][0].tolist(), kwargs.get("slots")  # row 0; the slots fed (all from 0 without a cache)
        for s, t in zip(range(len(x)) if slots is None else slots.tolist(), x):
            if s == P + len(ids) and not (ids and ids[-1] in ends):
                ids.append(t)
        text = tok.decode([t for t in ids if t not in ends]).rstrip("\ufffd")  # a character cut short waits
        if text.startswith(printed[0]) and len(text) > len(printed[0]):
            sys.stdout.write(text[len(printed[0]):])
            sys.stdout.flush()
            printed[0] = text
    return hook, printed


SETTINGS = {"temperature": float, "top_k": int, "top_p": float, "min_p": float, "repetition_penalty": float}


def describe(settings):
    """The sampling settings in one line: 'greedy' or 'temperature T', then each filter and the penalty that is on."""
    parts = ["greedy" if settings["temperature"] == 0 else f"temperature {settings['temperature']:g}"]
    if settings["temperature"]:
        parts += [f"{k} {settings[k]:g}" for k in ("top_k", "top_p", "min_p") if settings[k] is not None]
    if settings["repetition_penalty"] != 1:
        parts.append(f"repetition_penalty {settings['repetition_penalty']:g}")
    return ", ".join(parts)


def set_setting(settings, line):
    """'/set NAME VALUE' -> settings updated in place (VALUE 'none' or 0 turns top_k, top_p or min_p off), or a
    ValueError naming what is wrong; the settings stay as they were then."""
    parts = line.split()
    if len(parts) != 3 or parts[1] not in SETTINGS:
        raise ValueError(f"usage: /set NAME VALUE, NAME one of {', '.join(SETTINGS)}")
    name, value = parts[1], parts[2]
    try:
        new = None if value.lower() == "none" and name in ("top_k", "top_p", "min_p") else SETTINGS[name](value)
    except ValueError:
        raise ValueError(f"/set {name}: {value!r} is not a{'n integer' if name == 'top_k' else ' number'}") from None
    trial = {k: settings[k] for k in SETTINGS} | {name: new}
    trial["top_k"] = trial["top_k"] or None
    cli.check_sampling(**trial)
    settings.update(trial)


def session(model, tok, max_new_tokens, answer, settings, block_size=None):
    """A multi-turn session in the checkpoint's chat template (sample.py --chat without --prompt), each answer by
    answer(prompt ids, end ids) -> (reply ids without the end token, the round of each (block DLMs) or None): the
    checkpoint's sampler, reading the sampling settings from `settings` (a dict holding SETTINGS' keys), which
    /set NAME VALUE changes. An AR answer streams as it is generated (stream_view); on a terminal a DLM's answer
    is redrawn before every forward (live_view), and a block DLM's is then shown with the round view. Ctrl-C ends
    the turn (its question is dropped), /reset forgets the conversation, Ctrl-D, the end of the input or /quit ends
    the session. A terminal's lines come through input() (its line editing); piped input is read from sys.stdin
    line by line, each line echoed after the prompt and taken in order, so that none of it is lost. The oldest turns
    are dropped, and said so, when the conversation outgrows the model's positions."""
    c = model.config
    ends = tok.end_ids(c, turn=True)  # and <|im_end|>, the turn's end
    live, bs = sys.stdout.isatty() and c.attn != "causal", block_size or c.block_size
    piped = not sys.stdin.isatty()
    lines = (line.rstrip("\n") for line in sys.stdin) if piped else prompts()
    messages = []
    print(f"chat: {describe(settings)}. /set NAME VALUE changes a setting, Ctrl-C ends a turn, /reset forgets "
          "the conversation, Ctrl-D or /quit ends the session")
    while True:
        line = next(lines, None)
        if line is None:
            print()
            return
        if piped:
            print(f"you> {line}")  # the turn, as a terminal would show it
        if line.strip() in ("/quit", "/exit"):
            return
        if line.strip() == "/reset":
            messages = []
            print("(conversation forgotten)")
            continue
        if line.strip().startswith("/set"):
            try:
                set_setting(settings, line)
                print(f"({describe(settings)})")
            except ValueError as e:
                print(f"(/set: {e})")
            continue
        if not line.strip():
            continue
        turn = messages + [{"role": "user", "content": line}]
        try:
            ids = tok.apply_chat_template(turn)
            while len(ids) + max_new_tokens > c.max_position_embeddings and len(turn) > 2:
                turn = turn[2:]  # the oldest question and its answer
                print("(the oldest turn is dropped: the conversation outgrew the model's positions)")
                ids = tok.apply_chat_template(turn)
        except ValueError as e:  # no template, or one that does not render
            raise SystemExit(f"sample: --chat: {e}")
        P = -(-len(ids) // bs) * bs if c.attn == "block" else len(ids)  # the first generated slot
        printed = [""]
        if c.attn == "causal":
            hook, printed = stream_view(tok, P, ends)
        else:
            hook = live_view(tok, P, c.mask_token_id) if live else None
        handle = None if hook is None else model.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            reply, rounds = answer(ids, ends)
        except KeyboardInterrupt:
            print("\n(turn ended)")
            continue
        except ValueError as e:
            raise SystemExit(f"sample: {e}")
        finally:
            if handle is not None:
                handle.remove()
                if live:
                    print("\r\x1b[K", end="")
        text = tok.decode(reply)
        if rounds is not None:
            print(show_rounds(token_pieces(tok, reply), rounds, colour=live))
        else:  # the streamed text, then the rest (the last token, which no forward fed back)
            print(text[len(printed[0]):] if text.startswith(printed[0]) else "\n" + text)
        messages = turn + [{"role": "assistant", "content": text}]


def prompts():
    """The terminal's lines until Ctrl-D; Ctrl-C at the prompt gives a fresh one."""
    pending = b""
    while True:
        try:  # the prompt inside: a Ctrl-C just after it is drawn is this one's too
            print("you> ", end="", flush=True)
            line, pending = terminal_line(pending)
        except KeyboardInterrupt:  # Ctrl-C at the prompt
            print()
            continue
        if line is None:
            return
        yield line


def terminal_line(pending):
    """One line from the terminal (fd 0) and the bytes read past it, or None at Ctrl-D on an empty line. Not input():
    the SIGINT of Ctrl-C may be taken by one of torch's worker threads, and then a read blocked in the main thread is
    never interrupted. The signal's wakeup byte, written by whichever thread took it, is awaited beside the terminal."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    outer_fd = signal.set_wakeup_fd(wake_w)
    outer = signal.signal(signal.SIGINT, lambda *_: None)  # the wakeup byte says it; acted on below
    try:
        while b"\n" not in pending:
            ready = select.select([0, wake_r], [], [])[0]
            if wake_r in ready and signal.SIGINT in os.read(wake_r, 64):
                raise KeyboardInterrupt
            if 0 in ready:
                got = os.read(0, 65536)
                if not got and not pending:
                    return None, b""
                pending += got or b"\n"  # Ctrl-D after some text ends that line
    finally:
        signal.signal(signal.SIGINT, outer)
        signal.set_wakeup_fd(outer_fd)
        os.close(wake_r)
        os.close(wake_w)
    line, _, rest = pending.partition(b"\n")
    return line.decode(errors="replace"), rest
