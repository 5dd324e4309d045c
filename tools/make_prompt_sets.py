"""Write eaglepatch's built-in prompt sets (eaglepatch/tuning/prompt_sets/*.jsonl) from the hand-written templates
and topics below, with a fixed seed: the same script writes the same files.

    python tools/make_prompt_sets.py            # rewrite the sets
    python tools/make_prompt_sets.py --check    # exit 1 when the files differ from what it would write

Each line is ``{"messages": [...], "category": SET}`` (sent to the server's chat endpoint, so that the model's own
chat template applies) or, for the code set's completions, ``{"prompt": "...", "category": "code"}`` (sent to
``/generate`` as text, as an editor's completion request is). No line has ``max_tokens``: the load's
``--max-new-tokens`` caps every output, and the model's end of sequence is honoured.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "eaglepatch" / "tuning" / "prompt_sets"
SEED = 20261206


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def line(category: str, messages: list[dict] | None = None, prompt: str | None = None) -> dict:
    return ({"prompt": prompt} if prompt is not None else {"messages": messages}) | {"category": category}


# ----------------------------------------------------------------------------------------------------------------
# chat: single and multi-turn questions

CHAT_TOPICS = [
    "the water cycle", "compound interest", "how vaccines train the immune system", "baking sourdough bread",
    "getting over jet lag", "the causes of the French Revolution", "black holes", "composting at home",
    "learning a second language as an adult", "training for a first marathon", "negotiating a salary",
    "keeping a houseplant alive", "public speaking nerves", "index funds", "how electric cars charge",
    "photosynthesis", "sleep hygiene", "working remotely with a team across time zones", "budget travel in Japan",
    "the history of the printing press", "how noise-cancelling headphones work", "writing a good cover letter",
    "choosing a first programming language", "the basics of chess openings", "how credit scores are computed",
    "making friends in a new city", "the difference between weather and climate", "brewing pour-over coffee",
    "how bees communicate", "planning a vegetable garden", "reading a nutrition label", "how GPS finds a position",
    "the Roman aqueducts", "meditation for beginners", "saving for retirement in your twenties",
    "how a bill becomes a law", "the rules of cricket", "why the sky is blue", "adopting a rescue dog",
    "how earthquakes are measured", "writing a wedding toast", "the life cycle of a star",
]
CHAT_ASKS = [
    "Can you explain {t} to me as if I were completely new to it?",
    "What are the most common misconceptions about {t}?",
    "I have five minutes. Give me the key points about {t}.",
    "Write a short, friendly email inviting my colleagues to a lunch talk about {t}.",
    "What questions should I ask an expert on {t}?",
    "Give me three surprising facts about {t}, each with a one-line explanation.",
    "My friend says {t} is overrated. How would you answer them?",
    "How would you teach {t} to a curious twelve-year-old?",
    "Write a haiku and then a limerick about {t}.",
    "What is a good first step if I want to get better at understanding {t}?",
    "Compare two different ways people think about {t}, and say which you find more convincing.",
    "Draft three tweet-length posts that make {t} sound exciting.",
]
CHAT_REPLIES = [
    "Sure. In short, {t} comes down to a few simple ideas that build on each other; the details matter less than "
    "the overall picture, which I can walk you through.",
    "Good question. People often get {t} wrong because the everyday intuition points the other way. The main "
    "points are what happens, why it happens, and what it means for you.",
    "Here is a quick overview of {t}: it started as a practical problem, and most of what we know about it came "
    "from people trying to solve that problem better.",
]
CHAT_FOLLOWUPS = [
    "Thanks! Can you give me one concrete example?",
    "That was a bit long. Can you say it again in two sentences?",
    "Now explain it the way you would to a ten-year-old.",
    "What would you recommend I read next to learn more?",
    "Interesting. What is the part that experts still disagree about?",
    "Can you turn that into a short checklist I can print?",
]
CHAT_SYSTEMS = [
    "You are a concise, friendly assistant.",
    "You are a patient teacher who uses simple words.",
    "You answer in plain English and avoid jargon.",
]


def chat(rng: random.Random, n: int = 160) -> list[dict]:
    out, seen = [], set()
    while len(out) < n:
        t, ask = rng.choice(CHAT_TOPICS), rng.randrange(len(CHAT_ASKS))
        kind = rng.choice(("single", "single", "multi", "system"))
        key = (t, ask, kind)
        if key in seen:
            continue
        seen.add(key)
        first = user(CHAT_ASKS[ask].format(t=t))
        if kind == "single":
            msgs = [first]
        elif kind == "system":
            msgs = [{"role": "system", "content": rng.choice(CHAT_SYSTEMS)}, first]
        else:
            msgs = [first, {"role": "assistant", "content": rng.choice(CHAT_REPLIES).format(t=t)},
                    user(rng.choice(CHAT_FOLLOWUPS))]
        out.append(line("chat", msgs))
    return out


# ----------------------------------------------------------------------------------------------------------------
# code: write, explain, fix, and plain completions

CODE_TASKS = [
    ("parse_duration", "s: str", "int", "parses a duration like '1h30m' or '45s' into seconds"),
    ("merge_intervals", "intervals: list[tuple[int, int]]", "list[tuple[int, int]]",
     "merges overlapping intervals and returns them sorted"),
    ("is_palindrome", "s: str", "bool", "tells whether a string is a palindrome, ignoring case and punctuation"),
    ("top_k_words", "text: str, k: int", "list[str]", "returns the k most frequent words of a text"),
    ("flatten", "nested: list", "list", "flattens an arbitrarily nested list"),
    ("chunk", "items: list, size: int", "list[list]", "splits a list into chunks of at most size items"),
    ("roman_to_int", "s: str", "int", "converts a Roman numeral to an integer"),
    ("lru_get", "cache: dict, order: list, key: str", "object", "reads a key from a small LRU cache"),
    ("slugify", "title: str", "str", "turns a title into a URL slug"),
    ("median", "values: list[float]", "float", "returns the median of a list of numbers"),
    ("rotate_matrix", "m: list[list[int]]", "list[list[int]]", "rotates a square matrix 90 degrees clockwise"),
    ("validate_email", "address: str", "bool", "checks that an e-mail address looks valid"),
    ("word_wrap", "text: str, width: int", "list[str]", "wraps text to lines of at most width characters"),
    ("binary_search", "items: list[int], target: int", "int",
     "returns the index of target in a sorted list, or -1"),
    ("count_islands", "grid: list[list[str]]", "int", "counts the islands of '1' cells in a grid"),
    ("parse_csv_line", "line: str", "list[str]", "splits one CSV line, honouring quoted fields"),
    ("retry", "fn, attempts: int, delay: float", "object", "calls fn until it succeeds, waiting between tries"),
    ("dedupe_keep_order", "items: list", "list", "removes duplicates while keeping the first occurrence's order"),
    ("levenshtein", "a: str, b: str", "int", "computes the edit distance between two strings"),
    ("format_bytes", "n: int", "str", "formats a byte count as a human-readable size like '1.5 MiB'"),
    ("topological_sort", "graph: dict[str, list[str]]", "list[str]", "orders a dependency graph's nodes"),
    ("moving_average", "values: list[float], window: int", "list[float]", "computes a simple moving average"),
    ("parse_query_string", "qs: str", "dict[str, list[str]]", "parses a URL query string"),
    ("next_weekday", "day: str", "str", "returns the name of the weekday after the given one"),
]
CODE_LANGS = ["Python", "Python", "Python", "JavaScript", "TypeScript", "Go", "Rust", "Java", "C++"]
CODE_WRITE = [
    "Write a {lang} function `{name}` that {does}. Include a short docstring or comment and two example calls.",
    "In {lang}, implement `{name}`: it {does}. Keep it under 30 lines and explain the edge cases you handle.",
    "I need a {lang} function called `{name}` that {does}. Please add unit tests for it too.",
    "Show me an idiomatic {lang} version of a function that {does}, and say what its time complexity is.",
]
SNIPPETS = [
    ("python", "def f(xs):\n    seen = {}\n    for i, x in enumerate(xs):\n        if x in seen:\n            return seen[x], i\n"
               "        seen[x] = i\n    return None"),
    ("python", "import functools\n\n@functools.lru_cache(maxsize=None)\ndef ways(n):\n    if n < 0:\n        return 0\n"
               "    if n == 0:\n        return 1\n    return ways(n - 1) + ways(n - 2) + ways(n - 3)"),
    ("javascript", "const debounce = (fn, ms) => {\n  let t;\n  return (...args) => {\n    clearTimeout(t);\n"
                   "    t = setTimeout(() => fn(...args), ms);\n  };\n};"),
    ("python", "with open(path) as f:\n    rows = [line.rstrip('\\n').split('\\t') for line in f if line.strip()]\n"
               "header, *body = rows\nrecords = [dict(zip(header, r)) for r in body]"),
    ("go", "func worker(jobs <-chan int, results chan<- int) {\n\tfor j := range jobs {\n\t\tresults <- j * j\n\t}\n}"),
    ("sql", "SELECT c.name, COUNT(o.id) AS orders\nFROM customers c\nLEFT JOIN orders o ON o.customer_id = c.id\n"
            "GROUP BY c.name\nHAVING COUNT(o.id) > 3\nORDER BY orders DESC;"),
    ("rust", "fn largest<T: PartialOrd + Copy>(list: &[T]) -> T {\n    let mut largest = list[0];\n"
             "    for &item in list {\n        if item > largest {\n            largest = item;\n        }\n    }\n"
             "    largest\n}"),
    ("python", "class Stack:\n    def __init__(self):\n        self._items = []\n\n    def push(self, x):\n"
               "        self._items.append(x)\n\n    def pop(self):\n        return self._items.pop()\n\n"
               "    def __len__(self):\n        return len(self._items)"),
    ("bash", "for f in *.log; do\n  gzip -9 \"$f\" && mv \"$f.gz\" archive/\ndone"),
    ("c", "int count_bits(unsigned int x) {\n    int n = 0;\n    while (x) {\n        x &= x - 1;\n        n++;\n    }\n"
          "    return n;\n}"),
]
CODE_EXPLAIN = [
    "Explain what this code does, step by step:\n\n```{lang}\n{code}\n```",
    "What does this {lang} snippet do, and is there anything you would improve?\n\n```{lang}\n{code}\n```",
    "Add comments to this code so that a junior developer can follow it:\n\n```{lang}\n{code}\n```",
]
BUGS = [
    ("python", "returns the average of a list", "it crashes on an empty list",
     "def average(xs):\n    return sum(xs) / len(xs)"),
    ("python", "reverses the words of a sentence", "it reverses the letters instead",
     "def reverse_words(s):\n    return s[::-1]"),
    ("python", "collects the even numbers", "every call seems to remember the previous calls' numbers",
     "def evens(xs, out=[]):\n    for x in xs:\n        if x % 2 == 0:\n            out.append(x)\n    return out"),
    ("javascript", "sums an array of numbers", "it returns a string like '0123'",
     "function total(xs) {\n  return xs.reduce((a, b) => a + b, '');\n}"),
    ("python", "finds the largest number", "it is wrong when all numbers are negative",
     "def largest(xs):\n    best = 0\n    for x in xs:\n        if x > best:\n            best = x\n    return best"),
    ("python", "counts down from n to 1", "it never stops",
     "def countdown(n):\n    while n != 0:\n        print(n)\n        n -= 2"),
    ("go", "appends to a slice in a loop", "the slice stays empty after the call",
     "func fill(s []int) {\n\tfor i := 0; i < 3; i++ {\n\t\ts = append(s, i)\n\t}\n}"),
    ("python", "reads a file's lines", "the file handle is never closed and the last line is missing",
     "def lines(path):\n    f = open(path)\n    return f.read().split('\\n')[:-1]"),
    ("c", "copies a string", "it sometimes prints garbage at the end",
     "void copy(char *dst, const char *src) {\n    while (*src) {\n        *dst++ = *src++;\n    }\n}"),
    ("python", "checks whether a year is a leap year", "it says 1900 was a leap year",
     "def leap(y):\n    return y % 4 == 0"),
]
CODE_FIX = [
    "This {lang} function should {purpose}, but {symptom}. Find the bug and fix it:\n\n```{lang}\n{code}\n```",
    "Why does this code misbehave? It is meant to {purpose}, yet {symptom}.\n\n```{lang}\n{code}\n```",
]


def code(rng: random.Random, n: int = 160) -> list[dict]:
    out, seen = [], set()
    while len(out) < n:
        kind = rng.choice(("write", "write", "explain", "fix", "complete"))
        if kind == "write":
            name, _args, _ret, does = rng.choice(CODE_TASKS)
            lang, tpl = rng.choice(CODE_LANGS), rng.randrange(len(CODE_WRITE))
            key = (kind, name, lang, tpl)
            msg = CODE_WRITE[tpl].format(lang=lang, name=name, does=does)
        elif kind == "explain":
            i, tpl = rng.randrange(len(SNIPPETS)), rng.randrange(len(CODE_EXPLAIN))
            key = (kind, i, tpl)
            lang, snippet = SNIPPETS[i]
            msg = CODE_EXPLAIN[tpl].format(lang=lang, code=snippet)
        elif kind == "fix":
            i, tpl = rng.randrange(len(BUGS)), rng.randrange(len(CODE_FIX))
            key = (kind, i, tpl)
            lang, purpose, symptom, snippet = BUGS[i]
            msg = CODE_FIX[tpl].format(lang=lang, purpose=purpose, symptom=symptom, code=snippet)
        else:
            name, args, ret, does = rng.choice(CODE_TASKS)
            key = (kind, name)
            msg = f'def {name}({args}) -> {ret}:\n    """{does[0].upper() + does[1:]}."""\n'
        if key in seen:
            continue
        seen.add(key)
        out.append(line("code", prompt=msg) if kind == "complete" else line("code", [user(msg)]))
    return out


# ----------------------------------------------------------------------------------------------------------------
# summarize: long inputs (articles, meeting notes, reviews)

ARTICLES = {
    "a city's new bicycle lanes": [
        "The city council approved forty kilometres of protected bicycle lanes last spring.",
        "Construction began in the old town, where narrow streets had long made cycling dangerous.",
        "Shop owners first worried that losing parking spaces would cost them customers.",
        "Six months later, a survey of two hundred shops found that most reported steady or rising sales.",
        "Bicycle traffic on the main avenue doubled, while car traffic fell by about a fifth.",
        "Emergency services said response times had not changed, contrary to early fears.",
        "Critics point out that the lanes are empty in winter and that snow clearing costs more.",
        "The council plans to extend the network to the suburbs over the next three years.",
        "A citizens' group asked for better lighting and more bicycle parking near the train station.",
    ],
    "a small bakery's switch to a four-day week": [
        "A family bakery with twelve employees moved to a four-day working week in January.",
        "The owners kept wages the same and closed the shop on Mondays, their quietest day.",
        "To make up for the lost day, they shortened the menu from forty items to twenty-five.",
        "Staff turnover, which had been a constant problem, dropped to zero during the year.",
        "Revenue fell by three percent, but costs for overtime and temporary workers fell further.",
        "Several regular customers complained about the Monday closure at first.",
        "The bakery now sells pre-ordered bread boxes on Sunday evenings for Monday mornings.",
        "Other shops on the same street are watching the experiment closely.",
        "The owners say they will keep the schedule but may open on Mondays in December.",
    ],
    "a study on sleep and exam results": [
        "Researchers followed six hundred university students through two semesters.",
        "Students wore wrist trackers that recorded when and how long they slept.",
        "Those who slept less than six hours before exams scored, on average, eight points lower.",
        "The effect was stronger for exams that required problem solving than for memorisation.",
        "Irregular sleep schedules mattered almost as much as total hours of sleep.",
        "Students who studied late into the night often believed they were performing better.",
        "The authors caution that the study shows a correlation and cannot prove causation.",
        "They recommend that universities avoid scheduling exams before nine in the morning.",
        "A follow-up study will test whether sleep coaching improves results.",
    ],
    "a museum's return of looted artefacts": [
        "A national museum announced it would return thirty-one bronze sculptures to their country of origin.",
        "The sculptures were taken during a colonial military expedition more than a century ago.",
        "Historians at the museum spent four years tracing how each object entered the collection.",
        "The returning country plans to display them in a new museum opening next year.",
        "Some visitors regretted losing the works, while others welcomed the decision.",
        "The museum will keep high-resolution scans and will lend other works in exchange.",
        "Legal experts say the case may set a precedent for other collections in Europe.",
        "A joint research programme will study the sculptures' casting techniques.",
        "The handover ceremony will take place in the capital in the autumn.",
    ],
    "a rural school's solar panels": [
        "A rural primary school installed solar panels on its gymnasium roof with help from parents.",
        "The project cost less than expected because local electricians volunteered their time.",
        "The panels now cover about seventy percent of the school's electricity use.",
        "Pupils track the daily production on a screen in the entrance hall.",
        "Teachers have built maths and science lessons around the data.",
        "The savings pay for a new library assistant two days a week.",
        "Neighbouring schools have asked for the plans and the list of suppliers.",
        "A storm in March damaged two panels, which insurance replaced within weeks.",
        "The school hopes to add a battery so that evening events can run on solar power too.",
    ],
    "a software team's outage report": [
        "On Tuesday the payment service was unavailable for forty-seven minutes.",
        "A configuration change meant to raise a timeout was applied to the wrong cluster.",
        "Monitoring raised an alert after two minutes, but it was routed to an old on-call rotation.",
        "Engineers rolled back the change once the cause was found, and service recovered at once.",
        "About nine thousand payments failed and customers were asked to retry.",
        "No data was lost and no payment was charged twice.",
        "The team will require a second reviewer for every production configuration change.",
        "Alert routing will be tested weekly, and the on-call list will be generated automatically.",
        "A customer credit will be offered to the merchants most affected.",
    ],
    "a coastal town's fishing quotas": [
        "Fishing quotas for cod were cut by a third this year after a poor stock assessment.",
        "The town's fleet of twenty boats depends on cod for most of its income.",
        "Fishers argue that the survey missed the areas where cod are now most abundant.",
        "Scientists say warmer water has pushed the fish north and deeper.",
        "The regional government offered loans to help boats switch to other species.",
        "Some younger fishers have started working on offshore wind farms instead.",
        "A cooperative now sells part of the catch directly to restaurants at better prices.",
        "Tourism in summer has grown, partly thanks to boat tours run by former fishers.",
        "A new joint survey by fishers and scientists is planned for next spring.",
    ],
    "a library's late-fee experiment": [
        "The public library stopped charging late fees for a one-year trial.",
        "Librarians had noticed that fees kept many families, especially children, from borrowing.",
        "During the trial, the number of active borrowers grew by fifteen percent.",
        "Most books still came back on time, and overdue returns rose only slightly.",
        "Lost fee income was small compared with the cost of collecting the fees.",
        "Staff spent less time at the desk arguing about fines and more time helping readers.",
        "Some council members worried that removing fees sends the wrong message.",
        "The library will keep charging for books that are lost or damaged.",
        "The council will vote on making the change permanent at its next meeting.",
    ],
}
FILLER = [
    "Local newspapers have followed the story closely since it began.",
    "Not everyone agrees on what the numbers mean.",
    "Officials said more detailed figures would be published later in the year.",
    "Several people interviewed asked not to be named.",
    "The situation is still developing, and further changes are expected.",
    "A similar approach was tried elsewhere a decade ago, with mixed results.",
    "Supporters and opponents both say they want the same outcome.",
]
QUOTES = [
    "We did not expect it to work this well, to be honest",
    "It is too early to call it a success, but the first signs are good",
    "People were sceptical at the start, and some still are",
    "The hardest part was convincing everyone to try something new",
    "If we had known the costs in advance, we might have hesitated",
    "This is the kind of change that takes years to show its full effect",
    "I hope others learn from our mistakes as much as from what went right",
    "Nobody asked us what we thought before the decision was made",
]
SPEAKERS = [
    "Maria Lopez, who has lived in the area for thirty years", "a spokesperson for the organisers",
    "Daniel Osei, an independent economist", "one of the employees, who asked not to be named",
    "Hannah Berg, a local councillor", "a researcher who was not involved in the project",
]
MEETINGS = [
    ("the quarterly planning meeting", ["Priya", "Tom", "Alex", "Mei"], [
        "we are two weeks behind on the mobile release", "the budget for contractors is almost spent",
        "customer support tickets doubled after the last update", "the new onboarding flow tested well",
        "we should drop the reporting feature from this quarter", "hiring for the data role is still open",
        "the security audit found two medium issues", "marketing wants the release before the trade fair",
    ]),
    ("the neighbourhood association meeting", ["Ruth", "Sam", "Ines", "Karl"], [
        "the playground fence is broken again", "the summer party needs volunteers",
        "speeding on Elm Street is getting worse", "the community garden has a waiting list",
        "the treasurer's report shows a small surplus", "the city may plant trees along the main road",
        "the newsletter should go out monthly instead of quarterly", "we need a new meeting room",
    ]),
    ("the research group meeting", ["Dr. Okafor", "Lena", "Raj", "Yuki"], [
        "the second experiment could not be reproduced", "the grant report is due in three weeks",
        "the new microscope arrives next month", "two papers were accepted at the conference",
        "the shared server keeps running out of disk space", "we should write up the negative results",
        "a visiting student joins in June", "the lab safety training must be renewed",
    ]),
]
REVIEWS = {
    "a pair of running shoes": ["comfortable from the first run", "the sole wore out after three months",
                                "good grip on wet roads", "the laces keep coming undone", "runs a half size small",
                                "light and breathable in summer", "great value compared with big brands"],
    "a budget laptop": ["the battery lasts a full workday", "the screen is dim outdoors", "boots in seconds",
                        "the fan gets loud under load", "the keyboard feels solid", "only two USB ports",
                        "fine for documents and video calls, not for games"],
    "a coffee grinder": ["the grind is very even", "it is loud early in the morning", "easy to clean",
                         "the hopper is small", "it feels well built", "fine espresso settings are limited",
                         "it has lasted two years of daily use"],
    "a hotel by the sea": ["the view from the room was stunning", "breakfast was cold on two mornings",
                           "staff were friendly and helpful", "the walls are thin", "the pool is small but clean",
                           "it is a short walk to the old town", "parking is expensive"],
}
SUMMARIZE_ASKS = [
    "Summarize the following article in three sentences.\n\n{body}",
    "Write a one-paragraph summary of this text for a busy executive.\n\n{body}",
    "List the five most important points of the text below as bullet points.\n\n{body}",
    "Give me a TL;DR of this, then say who is most affected and why.\n\n{body}",
    "{body}\n\nSummarize the text above in plain language for a general audience.",
    "Read the following and write a headline and a two-sentence summary.\n\n{body}",
]
MEETING_ASKS = [
    "Here is a transcript of {m}. Summarize the decisions and list the action items with their owners.\n\n{body}",
    "Turn these notes from {m} into a short summary e-mail to people who missed it.\n\n{body}",
    "{body}\n\nWhat were the main concerns raised in {m}, and what was agreed?",
]
REVIEW_ASKS = [
    "Summarize these customer reviews of {p}: what do people like, and what do they complain about?\n\n{body}",
    "Here are reviews of {p}. Write a balanced three-sentence summary for a shopping site.\n\n{body}",
]


def _article(rng: random.Random, topic: str, facts: list[str]) -> str:
    picked = facts[:]
    head, rest = picked[0], picked[1:]
    rng.shuffle(rest)
    sentences = [head] + rest
    for _ in range(rng.randint(2, 3)):
        sentences.insert(rng.randint(1, len(sentences)), rng.choice(FILLER))
    for quote in rng.sample(QUOTES, rng.randint(2, 3)):
        sentences.insert(rng.randint(2, len(sentences)), f'"{quote}," said {rng.choice(SPEAKERS)}.')
    paras, i = [], 0
    while i < len(sentences):
        k = rng.randint(2, 4)
        paras.append(" ".join(sentences[i:i + k]))
        i += k
    return f"{topic[0].upper() + topic[1:]}\n\n" + "\n\n".join(paras)


def _meeting(rng: random.Random, people: list[str], points: list[str]) -> str:
    said = []
    for point in rng.sample(points, rng.randint(6, len(points))):
        a, b, c = rng.sample(people, 3)
        said.append(f"{a}: I think {point}.")
        said.append(f"{b}: " + rng.choice([
            "Agreed. Can you take that on and report back next week?", "I'm not sure that's right; let's check the "
            "numbers before we decide.", "Then we should tell the others today.", "Let's put it on the list and "
            "decide on Friday.", "That matches what I heard too.", "Who owns this? I can do it if nobody else can."]))
        said.append(f"{c}: " + rng.choice([
            "Fine by me.", "Let's note that in the minutes.", "I'll send the details around after the meeting.",
            "We discussed this last time as well, so let's close it this time.", "Agreed, with a deadline of the "
            "end of the month.", "I'd rather wait for more information."]))
    return "\n".join(said)


def summarize(rng: random.Random, n: int = 100) -> list[dict]:
    out, seen = [], set()
    while len(out) < n:
        kind = rng.choice(("article", "article", "article", "meeting", "review"))
        if kind == "article":
            topic = rng.choice(sorted(ARTICLES))
            tpl = rng.randrange(len(SUMMARIZE_ASKS))
            body = _article(rng, topic, ARTICLES[topic])
            msg = SUMMARIZE_ASKS[tpl].format(body=body)
        elif kind == "meeting":
            m, people, points = rng.choice(MEETINGS)
            body = _meeting(rng, people, points)
            msg = rng.choice(MEETING_ASKS).format(m=m, body=body)
        else:
            p = rng.choice(sorted(REVIEWS))
            notes = rng.sample(REVIEWS[p], 5)
            body = "\n".join(f"Review {i + 1} ({rng.randint(1, 5)} stars): {note[0].upper() + note[1:]}; "
                             f"{rng.choice(REVIEWS[p])}." for i, note in enumerate(notes))
            msg = rng.choice(REVIEW_ASKS).format(p=p, body=body)
        if msg in seen:
            continue
        seen.add(msg)
        out.append(line("summarize", [user(msg)]))
    return out


# ----------------------------------------------------------------------------------------------------------------
# reasoning: math and logic

def _word_problem(rng: random.Random) -> str:
    kind = rng.randrange(10)
    if kind == 0:
        a, b, d = rng.randint(40, 90), rng.randint(50, 110), rng.randint(200, 600)
        return (f"Two trains leave stations {d} km apart at the same time and travel toward each other, one at {a} "
                f"km/h and the other at {b} km/h. How long until they meet, and how far has each travelled?")
    if kind == 1:
        w, days, w2 = rng.randint(3, 9), rng.randint(4, 20), rng.randint(2, 12)
        return (f"If {w} workers can paint a building in {days} days, how many days would {w2} workers need, "
                "working at the same rate? Explain your reasoning.")
    if kind == 2:
        p, r, y = rng.choice([1000, 2500, 5000, 12000]), rng.choice([2, 3, 4, 5, 7]), rng.randint(2, 10)
        return (f"I invest ${p} at {r}% interest compounded yearly. How much will I have after {y} years? Show "
                "each step.")
    if kind == 3:
        start, step = rng.randint(1, 9), rng.randint(2, 5)
        seq = [start + step * i * (i + 1) // 2 for i in range(5)]
        return f"What is the next number in the sequence {', '.join(map(str, seq))}, ...? Explain the pattern."
    if kind == 4:
        r, g = rng.randint(2, 8), rng.randint(2, 8)
        return (f"A bag holds {r} red and {g} green marbles. I draw two without putting the first back. What is "
                "the probability that both are the same colour?")
    if kind == 5:
        n = rng.randint(12, 60)
        return f"How many positive divisors does {n * rng.choice([6, 10, 12])} have? List them and check your count."
    if kind == 6:
        age, k, later = rng.randint(4, 12), rng.randint(2, 4), rng.randint(3, 15)
        return (f"A mother is {k} times as old as her son, who is {age}. In how many years will she be exactly "
                f"twice his age? And how old will each be in {later} years?")
    if kind == 7:
        l, w = rng.randint(5, 30), rng.randint(3, 20)
        return (f"A rectangular garden is {l} m by {w} m. A path 1 m wide runs all around the outside of it. "
                "What is the area of the path?")
    if kind == 8:
        price, off, tax = rng.choice([40, 80, 120, 250]), rng.choice([10, 15, 20, 25]), rng.choice([5, 8, 10, 20])
        return (f"A jacket costs ${price}. It is discounted by {off}%, then {tax}% sales tax is added. Is that the "
                f"same as adding the tax first and then discounting? Work out both.")
    a, b = rng.randint(10, 99), rng.randint(10, 99)
    return f"Without a calculator, compute {a} x {b} and explain a mental method that makes it easy."


LOGIC = [
    "Alice, Bob and Carol each own one pet: a cat, a dog or a fish. Alice is allergic to fur. Bob's pet cannot "
    "swim. Carol does not own the dog. Who owns which pet?",
    "A farmer must take a wolf, a goat and a cabbage across a river in a boat that holds him and one item. The "
    "wolf eats the goat and the goat eats the cabbage if left alone. How does he do it?",
    "Three boxes are labelled 'apples', 'oranges' and 'mixed', and every label is wrong. You may take one fruit "
    "from one box. How do you relabel them correctly?",
    "Prove that the sum of two odd numbers is always even.",
    "Is the statement 'all squares are rectangles, so all rectangles are squares' valid? Explain the logical error.",
    "You have two ropes that each take exactly one hour to burn, unevenly. How can you measure 45 minutes?",
    "In a room of 23 people, why is it more likely than not that two share a birthday? Explain without heavy "
    "algebra.",
    "A bat and a ball cost $1.10 in total. The bat costs $1.00 more than the ball. How much does the ball cost? "
    "Explain why the quick answer is wrong.",
    "Five people sit in a row. Dana is not at either end, Eli sits directly right of Fay, and Gus sits at the left "
    "end. Where can Hal sit? List every arrangement that works.",
    "Show that there are infinitely many prime numbers.",
    "If it rains, the match is cancelled. The match was not cancelled. What can you conclude, and which rule of "
    "logic is that?",
    "Twelve coins look the same, but one is heavier or lighter. With three weighings on a balance, how do you find "
    "it and tell whether it is heavier or lighter?",
    "A clock shows 3:15. What is the angle between the hour and minute hands?",
    "Why does 0.999... (repeating) equal 1? Give two different arguments.",
    "Knights always tell the truth and knaves always lie. A says 'B is a knave.' B says 'A and I are the same "
    "kind.' What are A and B?",
    "Sort these by growth rate for large n, and justify: n log n, 2^n, n^2, log n, n!, sqrt(n).",
]
REASONING_STYLES = [
    "{q}", "{q} Think step by step.", "{q} Give the final answer on its own line at the end.",
    "Solve this carefully and check your answer: {q}", "{q} Explain your reasoning to a student.",
]


def reasoning(rng: random.Random, n: int = 160) -> list[dict]:
    out, seen = [], set()
    while len(out) < n:
        q = rng.choice(LOGIC) if rng.random() < 0.3 else _word_problem(rng)
        msg = rng.choice(REASONING_STYLES).format(q=q)
        if msg in seen:
            continue
        seen.add(msg)
        out.append(line("reasoning", [user(msg)]))
    return out


def render() -> dict[str, str]:
    out = {}
    for name, make in (("chat", chat), ("code", code), ("summarize", summarize), ("reasoning", reasoning)):
        rows = make(random.Random(f"{SEED}:{name}"))
        out[name] = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    return out


def main(argv: list[str]) -> int:
    files = render()
    if "--check" in argv:
        stale = [n for n, text in files.items() if not (OUT / f"{n}.jsonl").is_file()
                 or (OUT / f"{n}.jsonl").read_text(encoding="utf-8") != text]
        for n in stale:
            print(f"{OUT / n}.jsonl is not what tools/make_prompt_sets.py writes: run it", file=sys.stderr)
        return 1 if stale else 0
    OUT.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (OUT / f"{name}.jsonl").write_text(text, encoding="utf-8")
        print(f"{OUT / name}.jsonl: {text.count(chr(10))} prompts, {len(text.encode()) // 1024} KiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
