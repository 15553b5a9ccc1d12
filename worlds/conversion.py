"""
The real model's conversion data: thousands of chat prompts made from tables in this file (sums, capitals, and
open questions with no checker), the teacher's own greedy replies to the training ones, generated in batches into a
cache that a rerun resumes, and held-out prompts split by subject, so that a held-out country (sum, table entry)
never appears in a training prompt: the test then measures what a student kept from pretraining, not what it
memorised from the teacher's replies.

    python -m worlds.conversion --ckpt out/real/ar --out_dir data/real --chats 5000
        -> data/real/replies.jsonl (the cache: the teacher's reply to each training prompt, in order; its first line
           names the teacher), chats.jsonl (the replies that ended, as conversations: lib/corpus.py --source),
           heldout.jsonl (sum, capital and open prompts; worlds/realworld.py --prompts), validation.jsonl (more
           of them, none a test prompt: the sweeps' split), prompts.jsonl (the training prompts as chat turns:
           distill.py --prompts)

Sums and capitals are judged by realworld.check; open prompts by the F1 of a reply's words with the teacher's reply
and by the student's −ELBO of that reply (realworld.evaluate, realworld.nelbo_bits).
"""
import hashlib
import json
import os
import random
import re
from pathlib import Path

from lib import cli
from lib import data

# countries whose capital has one common English spelling without accents (the checker looks for it in the reply)
CAPITALS = dict(pair.split(":") for pair in (
    "Afghanistan:Kabul;Albania:Tirana;Algeria:Algiers;Angola:Luanda;Argentina:Buenos Aires;Armenia:Yerevan;"
    "Australia:Canberra;Austria:Vienna;Azerbaijan:Baku;Bahamas:Nassau;Bahrain:Manama;Bangladesh:Dhaka;"
    "Barbados:Bridgetown;Belarus:Minsk;Belgium:Brussels;Belize:Belmopan;Bhutan:Thimphu;Botswana:Gaborone;"
    "Bulgaria:Sofia;Burkina Faso:Ouagadougou;Cambodia:Phnom Penh;Canada:Ottawa;Chile:Santiago;China:Beijing;"
    "Croatia:Zagreb;Cuba:Havana;Cyprus:Nicosia;Czech Republic:Prague;Denmark:Copenhagen;"
    "Dominican Republic:Santo Domingo;Ecuador:Quito;Egypt:Cairo;El Salvador:San Salvador;Eritrea:Asmara;"
    "Estonia:Tallinn;Ethiopia:Addis Ababa;Fiji:Suva;Finland:Helsinki;France:Paris;Gabon:Libreville;Germany:Berlin;"
    "Ghana:Accra;Greece:Athens;Guatemala:Guatemala City;Guyana:Georgetown;Haiti:Port-au-Prince;"
    "Honduras:Tegucigalpa;Hungary:Budapest;India:New Delhi;Indonesia:Jakarta;Iran:Tehran;Iraq:Baghdad;"
    "Ireland:Dublin;Italy:Rome;Jamaica:Kingston;Japan:Tokyo;Jordan:Amman;Kazakhstan:Astana;Kenya:Nairobi;"
    "Kuwait:Kuwait City;Kyrgyzstan:Bishkek;Laos:Vientiane;Latvia:Riga;Lebanon:Beirut;Liberia:Monrovia;"
    "Libya:Tripoli;Liechtenstein:Vaduz;Lithuania:Vilnius;Madagascar:Antananarivo;Malawi:Lilongwe;"
    "Malaysia:Kuala Lumpur;Mali:Bamako;Malta:Valletta;Mauritania:Nouakchott;Mauritius:Port Louis;"
    "Mexico:Mexico City;Mongolia:Ulaanbaatar;Montenegro:Podgorica;Morocco:Rabat;Mozambique:Maputo;"
    "Namibia:Windhoek;Nepal:Kathmandu;Netherlands:Amsterdam;New Zealand:Wellington;Nicaragua:Managua;"
    "Niger:Niamey;Nigeria:Abuja;North Korea:Pyongyang;North Macedonia:Skopje;Norway:Oslo;Oman:Muscat;"
    "Pakistan:Islamabad;Panama:Panama City;Papua New Guinea:Port Moresby;Peru:Lima;Philippines:Manila;"
    "Poland:Warsaw;Portugal:Lisbon;Qatar:Doha;Romania:Bucharest;Russia:Moscow;Rwanda:Kigali;Saudi Arabia:Riyadh;"
    "Senegal:Dakar;Serbia:Belgrade;Sierra Leone:Freetown;Slovakia:Bratislava;Slovenia:Ljubljana;"
    "Somalia:Mogadishu;South Korea:Seoul;Spain:Madrid;Sudan:Khartoum;Suriname:Paramaribo;Sweden:Stockholm;"
    "Switzerland:Bern;Syria:Damascus;Taiwan:Taipei;Tajikistan:Dushanbe;Tanzania:Dodoma;Thailand:Bangkok;"
    "Trinidad and Tobago:Port of Spain;Tunisia:Tunis;Turkey:Ankara;Turkmenistan:Ashgabat;Uganda:Kampala;"
    "United Kingdom:London;United States:Washington;Uruguay:Montevideo;Uzbekistan:Tashkent;Venezuela:Caracas;"
    "Vietnam:Hanoi;Zambia:Lusaka;Zimbabwe:Harare").split(";"))
ANIMALS = ("dog cat horse cow sheep lion tiger elephant giraffe zebra monkey bear wolf fox rabbit deer eagle owl "
           "penguin dolphin whale shark frog snake turtle bee ant butterfly spider camel kangaroo koala panda goat pig "
           "duck chicken parrot crocodile octopus").split()
ADJECTIVES = ("hot cold big small fast slow happy sad bright dark loud quiet hard soft heavy light old young rich poor "
              "strong weak high low wet dry early late long short full empty clean dirty easy difficult cheap "
              "expensive sweet bitter").split()
OBJECTS = ("apple river stone cloud chair lemon piano train garden window candle forest bottle rocket pencil mirror "
           "planet button jacket ladder basket helmet marble pillow tunnel violin wallet anchor bridge carpet desert "
           "engine umbrella clock kettle hammer blanket lamp key bicycle").split()
JOBS = ("doctor teacher farmer pilot chef nurse baker painter firefighter engineer scientist lawyer dentist carpenter "
        "plumber librarian musician writer photographer gardener").split()

ASK = {  # family -> templates; {a}, {b}: numbers, {x}: the subject, {y}: a second one
    "sum": ("What is {a} + {b}? Reply with the number only.", "Add {a} and {b}. Reply with the number only.",
            "What is the sum of {a} and {b}? Reply with the number only.",
            "Compute {a} plus {b}. Reply with the number only."),
    "capital": ("What is the capital of {x}?", "Which city is the capital of {x}?", "Name the capital of {x}.",
                "What is the capital city of {x}?", "Tell me the capital of {x}.",
                "{x} has which city as its capital?"),
    "animal": ("Describe a {x} in one sentence.", "Where does a {x} live?", "What does a {x} eat?",
               "Tell me one fact about the {x}.", "Which is bigger, a {x} or a {y}?",
               "What is the difference between a {x} and a {y}?"),
    "adjective": ("What is the opposite of {x}?", "Give a synonym for {x}.", "Use the word {x} in a sentence.",
                  "Write a short sentence about a {x} {y}."),
    "object": ("What is a {x} used for?", "Write a sentence with the word {x}.", "Describe a {x} in a few words.",
               "Where would you find a {x}?"),
    "job": ("What does a {x} do?", "Where does a {x} work?", "What tools does a {x} use?",
            "What skills does a {x} need?"),
}
OPEN = ("animal", "adjective", "object", "job")  # scored by F1 with the teacher's reply and the −ELBO of it
TABLES = dict(animal=ANIMALS, adjective=ADJECTIVES, object=OBJECTS, job=JOBS)


def make(family, rng, heldout_fraction=0.25):
    """A random item: dict(family, prompt, answer (None for an open one), subject: what the split is by; an open
    question's second entry, if it has one, is from the same side of the split as its subject)."""
    ask = rng.choice(ASK[family])
    if family == "sum":
        a, b = rng.randint(1, 50), rng.randint(1, 50)
        return dict(family="sum", prompt=ask.format(a=a, b=b), answer=str(a + b),
                    subject=f"sum {min(a, b)} {max(a, b)}")
    if family == "capital":
        x = rng.choice(sorted(CAPITALS))
        return dict(family="capital", prompt=ask.format(x=x), answer=CAPITALS[x], subject=f"capital {x}")
    ask += " Answer in one sentence."  # the teacher's reply then ends within a canvas of 32 tokens more often
    x = rng.choice(TABLES[family])
    side, second = data.is_val(f"{family} {x}", heldout_fraction), "object" if family == "adjective" else family
    y = rng.choice([v for v in TABLES[second] if v != x and data.is_val(f"{second} {v}", heldout_fraction) == side])
    return dict(family="open", prompt=ask.format(x=x, y=y), answer=None, subject=f"{family} {x}")


def split(*, n_train=5000, n_heldout=100, seed=1337, heldout_fraction=0.25, mix=(0.4, 0.1, 0.5)):
    """(train, heldout): distinct prompts, mix the shares of sums, capitals and open ones in training (in the order
    drawn, the families interleaved); a prompt is held out when its subject is (data.is_val of the sum's two numbers,
    the country, the open question's first table entry), so no held-out subject is in any training prompt;
    n_heldout per family (sum, capital, open). ValueError when the tables hold fewer distinct prompts."""
    rng, seen = random.Random(seed), set()
    quota = dict(sum=round(mix[0] * n_train), capital=round(mix[1] * n_train))
    quota["open"] = n_train - quota["sum"] - quota["capital"]
    train, held = {f: [] for f in quota}, {f: [] for f in quota}
    families, order = ("sum", "capital", *OPEN), []
    for _ in range(100 * (n_train + 3 * n_heldout)):
        if all(len(train[f]) >= quota[f] and len(held[f]) >= n_heldout for f in quota):
            break
        it = make(rng.choice(families), rng, heldout_fraction)
        f = it["family"]
        if it["prompt"] in seen:
            continue
        seen.add(it["prompt"])
        if data.is_val(it["subject"], heldout_fraction):
            if len(held[f]) < n_heldout:
                held[f].append(it)
        elif len(train[f]) < quota[f]:
            train[f].append(it)
            order.append(it)
    if any(len(train[f]) < quota[f] or len(held[f]) < n_heldout for f in quota):
        counts = {f: (len(train[f]), len(held[f])) for f in quota}
        raise ValueError(f"the tables hold fewer distinct prompts than asked: (training, held out) per family "
                         f"{counts}, asked {quota} and {n_heldout} each")
    return order, [it for f in held for it in held[f]]


def validation(held, n, *, seed=1337, heldout_fraction=0.25):
    """n more held-out prompts per family (sum, capital, open), none of them a test prompt (`held`): the split that
    learning rates are chosen on. Their subjects are held out as the test's are, so a validation score measures what
    a student kept from pretraining, as the test does. The sums are of pairs the test does not add; the held-out
    countries (32) and open subjects (36) are too few to split again, so those ask about the test's subjects in
    other words (another phrasing, another second entry). ValueError when the tables hold fewer such prompts."""
    rng, seen = random.Random(f"validation-{seed}"), {it["prompt"] for it in held}  # the test's prompts, then ours
    seen |= {it["subject"] for it in held if it["family"] == "sum"}  # a sum's subject: its pair of numbers
    out = {f: [] for f in ("sum", "capital", "open")}
    families = ("sum", "capital", *OPEN)
    for _ in range(1000 * 3 * n):
        if all(len(v) >= n for v in out.values()):
            break
        it = make(rng.choice(families), rng, heldout_fraction)
        new = it["prompt"] not in seen and it["subject"] not in seen
        if data.is_val(it["subject"], heldout_fraction) and new and len(out[it["family"]]) < n:
            seen.add(it["prompt"])
            out[it["family"]].append(it)
    if any(len(v) < n for v in out.values()):
        raise ValueError(f"the tables hold fewer held-out prompts outside the test than asked: "
                         f"{ {f: len(v) for f, v in out.items()} }, asked {n} each")
    return [it for f in out for it in out[f]]


def countries_in(text):
    """The countries of CAPITALS named in a text (whole words: "Niger" is not in "Nigeria")."""
    return {c for c in CAPITALS if re.search(rf"(?<![\w-]){re.escape(c)}(?![\w-])", text)}


# ---- the teacher's replies, cached ------------------------------------------------------------------------

def fingerprint(ckpt, **settings):
    """The teacher's identity: a hash of its config.json and weight files, and of the generation settings."""
    h = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    ckpt = Path(ckpt)
    files = [ckpt / "config.json", ckpt / "generation_config.json", *sorted(ckpt.glob("*.safetensors"))]
    for f in [f for f in files if f.exists()]:
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 22), b""):
                h.update(chunk)
    return h.hexdigest()


def read_cache(path, teacher, items, who="conversion"):
    """The cached replies of `path` (a list of {prompt, reply, ended}, in the order of `items`), [] when there is no
    cache; a partial last line (a run stopped while writing) is dropped. A one-line exit when the cache names another
    teacher or holds other prompts: nothing is overwritten."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    head = json.loads(lines[0]) if lines[0] else {}
    if head.get("teacher") != teacher:
        raise SystemExit(f"{who}: {path} holds the replies of another teacher or other generation settings "
                         f"(fingerprint {str(head.get('teacher'))[:12]}…, this one {teacher[:12]}…): delete it, or "
                         f"pass another --out_dir")
    rows = []
    for line in lines[1:]:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break  # a partial last line, or the empty string after the last newline
    if [r["prompt"] for r in rows] != [it["prompt"] for it in items[:len(rows)]]:
        raise SystemExit(f"{who}: {path} holds replies to other prompts than these (another --seed or --chats?): "
                         f"delete it, or pass another --out_dir")
    return rows


def teacher_replies(model, tok, items, path, teacher, *, batch_size=32, max_new_tokens=32, reply=None):
    """Each item's greedy reply by `model`, generated batch by batch and appended to the cache `path` (flushed and
    synced after each batch), so that a rerun reuses every finished batch -> [{prompt, reply, ended}] in item order.
    ended: the reply closed its turn within max_new_tokens. reply(items) -> [(text, ended)]: the generator (default
    realworld.replies through the model's sampler)."""
    from worlds import realworld
    from tqdm import tqdm
    rows = read_cache(path, teacher, items)
    if reply is None:
        def reply(batch):
            ends = []
            texts = realworld.replies(model, tok, batch, batch_size=len(batch), max_new_tokens=max_new_tokens,
                                      counts=ends)
            return [(t, c["ended"]) for t, c in zip(texts, ends)]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not rows:
        path.write_text(json.dumps(dict(teacher=teacher)) + "\n")
    else:  # drop a partial last line before appending
        path.write_text("\n".join([json.dumps(dict(teacher=teacher))] + [json.dumps(r) for r in rows]) + "\n")
    with open(path, "a") as f, tqdm(total=len(items), initial=len(rows), desc="teacher replies") as bar:
        for s in range(len(rows), len(items), batch_size):
            batch = items[s:s + batch_size]
            new = [dict(prompt=it["prompt"], reply=text, ended=bool(ended))
                   for it, (text, ended) in zip(batch, reply(batch))]
            f.write("".join(json.dumps(r) + "\n" for r in new))
            f.flush()
            os.fsync(f.fileno())
            rows += new
            bar.update(len(batch))
    return rows


def write_chats(path, items, rows):
    """chats.jsonl: the replies that ended, as conversations (lib/corpus.py --source); -> how many were kept."""
    kept = [(it, r) for it, r in zip(items, rows) if r["ended"] and r["reply"].strip()]
    with open(path, "w") as f:
        for it, r in kept:
            f.write(json.dumps(dict(messages=[dict(role="user", content=it["prompt"]),
                                              dict(role="assistant", content=r["reply"])], family=it["family"])) + "\n")
    return len(kept)


def main():
    p = cli.parser(__doc__)
    p.add_argument("--ckpt", required=True, help="the teacher: an AR checkpoint (convert.py --gguf)")
    p.add_argument("--out_dir", required=True, help="replies.jsonl, chats.jsonl, heldout.jsonl and prompts.jsonl "
                   "go here")
    p.add_argument("--chats", type=int, default=5000, help="training prompts the teacher answers")
    p.add_argument("--per_family", type=int, default=100, help="held-out prompts per family (sum, capital, open)")
    p.add_argument("--validation", type=int, default=50, help="validation prompts per family (held out by subject "
                   "as the test is, none a test prompt: learning rates are chosen on them)")
    p.add_argument("--max_new_tokens", type=int, default=32, help="a reply's length at most; longer ones are cut "
                   "and left out of chats.jsonl")
    p.add_argument("--batch_size", type=int, default=256, help="replies generated per batch (and per cache write)")
    p.add_argument("--device", default="auto", help="auto: cuda if available, else cpu")
    p.add_argument("--seed", type=int, default=1337, help="draws the prompts (the split is by subject)")
    args = p.parse_args()
    if min(args.chats, args.per_family, args.validation, args.max_new_tokens, args.batch_size) <= 0:
        p.error("--chats, --per_family, --validation, --max_new_tokens and --batch_size must be positive")
    from lib import training
    device, _ = cli.setup(args.device, args.seed)
    model = training.load_model(args.ckpt, device, "conversion: --ckpt", attn="causal").eval()
    tok = training.load_tokenizer(args.ckpt, model.config)
    try:
        train, held = split(n_train=args.chats, n_heldout=args.per_family, seed=args.seed)
        val = validation(held, args.validation, seed=args.seed)
    except ValueError as e:
        p.error(str(e))
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, items in (("heldout", held), ("validation", val)):
        (out / f"{name}.jsonl").write_text("".join(json.dumps(it) + "\n" for it in items))
    (out / "prompts.jsonl").write_text("".join(json.dumps(dict(it, chat=True)) + "\n" for it in train))
    teacher = fingerprint(args.ckpt, max_new_tokens=args.max_new_tokens, greedy=True)
    rows = teacher_replies(model, tok, train, out / "replies.jsonl", teacher, batch_size=args.batch_size,
                           max_new_tokens=args.max_new_tokens)
    n = write_chats(out / "chats.jsonl", train, rows)
    print(f"wrote {out}/chats.jsonl: {n} of {len(rows)} replies (the rest did not end within --max_new_tokens "
          f"{args.max_new_tokens}), heldout.jsonl: {len(held)} prompts, validation.jsonl: {len(val)}")


if __name__ == "__main__":
    main()
