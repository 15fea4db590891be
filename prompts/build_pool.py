"""Build ``prompts/pool.jsonl``: the mixed-domain candidate prompt pool (seven domains, Paper III §3.3 protocol).

Run from the repository root with the project interpreter::

    python prompts/build_pool.py          # writes prompts/pool.jsonl
    python prompts/build_pool.py --check  # exits 1 if the committed file differs from a fresh build

Two kinds of rows:

* handwritten prompts (``source: "written for interp_bayes"``), listed at the end of this file (``HANDWRITTEN``);
* excerpts cut deterministically from text that ships with CPython 3.11 (the interpreter running this script):
  Python code cut from functions of standard-library modules (domain ``code``), prose from the language
  reference bundled in ``Lib/pydoc_data/topics.py`` (domain ``encyclopedic``) and the Zen of Python from
  ``Lib/this.py`` (domain ``philosophy``). Each excerpt stops mid-statement or mid-sentence so that the next
  token is meaningful; no prompt ends in whitespace. Nothing is downloaded.

The excerpts depend on the standard library's exact text; the committed file was built with CPython 3.11.7.
"""

from __future__ import annotations

import argparse
import ast
import codecs
import json
import re
import sys
import sysconfig
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
OUT = HERE / "pool.jsonl"
STDLIB = Path(sysconfig.get_paths()["stdlib"])
WRITTEN = "written for interp_bayes"
DOMAINS = ("encyclopedic", "news", "fiction", "code", "qa", "mathematics", "philosophy")

# Standard-library modules to cut Python code from (at most CODE_PER_MODULE functions each, in file order).
CODE_MODULES = [
    "abc.py", "argparse.py", "base64.py", "bisect.py", "calendar.py", "cmd.py", "colorsys.py", "configparser.py",
    "contextlib.py", "copy.py", "csv.py", "dataclasses.py", "datetime.py", "difflib.py", "enum.py", "fnmatch.py",
    "fractions.py", "functools.py", "genericpath.py", "getopt.py", "glob.py", "gzip.py", "heapq.py", "hmac.py",
    "inspect.py", "ipaddress.py", "json/__init__.py", "json/decoder.py", "json/encoder.py", "linecache.py",
    "logging/__init__.py", "mimetypes.py", "ntpath.py", "operator.py", "pathlib.py", "pickle.py", "posixpath.py",
    "pprint.py", "queue.py", "random.py", "reprlib.py", "sched.py", "secrets.py", "shlex.py", "shutil.py",
    "statistics.py", "string.py", "tempfile.py", "textwrap.py", "threading.py", "tokenize.py", "traceback.py",
    "types.py", "typing.py", "urllib/parse.py", "uuid.py", "warnings.py", "weakref.py", "zipfile.py",
    "collections/__init__.py", "email/utils.py", "http/cookies.py", "html/__init__.py", "unittest/case.py",
]
CODE_PER_MODULE = 2
CODE_MAX_CHARS = 280
CODE_MAX_PIECES = 80  # words + punctuation marks, a tokenizer-free bound that keeps excerpts under ~110 tokens
# Language-reference topics whose prose is cut into encyclopedic prompts.
TOPIC_LIMIT = 30
FUNCTION_WORDS = {"the", "a", "an", "of", "to", "in", "for", "by", "with", "is", "are", "that", "from", "on", "as",
                  "be", "its", "their", "which", "and", "or", "than", "into", "not"}


def stdlib_name(rel: str) -> str:
    return f"cpython Lib/{rel}"


# --------------------------------------------------------------------------------------------------- code excerpts

def _function_nodes(tree: ast.AST):
    """Plain functions and methods in source order (nested functions skipped)."""
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node
        elif isinstance(node, ast.ClassDef):
            for sub in node.body:
                if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    yield sub


def _strip_docstring(node, lines: list[str]) -> list[str]:
    """The function's lines without its docstring (signature and decorators kept)."""
    start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
    out = lines[start:node.end_lineno]
    body0 = node.body[0]
    if isinstance(body0, ast.Expr) and isinstance(getattr(body0, "value", None), ast.Constant) \
            and isinstance(body0.value.value, str):
        a, b = body0.lineno - 1 - start, body0.end_lineno - start
        out = out[:a] + out[b:]
    return [ln for ln in out if ln.strip() and not ln.strip().startswith("#")]


def _cut_line(line: str, strategy: int) -> str | None:
    """A prefix of ``line`` that stops mid-statement, chosen by ``strategy`` (0..3); None if it does not apply."""
    s = line.rstrip()
    if strategy == 0:  # right after `return` / `=` / `yield`: open-ended expression
        m = re.search(r"\b(return|yield)\b(?= )", s) or re.search(r"(?<![=!<>+\-*/%&|^:]) = ", s)
        if m:
            return s[:m.end()].rstrip()
    elif strategy == 1:  # just before the last closing bracket: nearly deterministic
        i = max(s.rfind(")"), s.rfind("]"))
        if i > 0 and s[:i].rstrip() == s[:i] and s[i - 1] not in "([":
            return s[:i]
    elif strategy == 2:  # after an opening bracket: argument to come
        i = s.find("(")
        if 0 < i < len(s) - 2:
            return s[:i + 1]
    elif strategy == 3:  # after an attribute dot
        m = re.search(r"\w\.(?=\w)", s)
        if m:
            return s[:m.end()]
    return None


def code_excerpts() -> list[dict]:
    rows = []
    for k, rel in enumerate(CODE_MODULES):
        path = STDLIB / rel
        src = path.read_text(encoding="utf-8")
        tree = ast.parse(src)
        lines = src.splitlines()
        taken = 0
        for j, node in enumerate(_function_nodes(tree)):
            if taken == CODE_PER_MODULE:
                break
            body = _strip_docstring(node, lines)
            if not 3 <= len(body) <= 14:
                continue
            body = textwrap.dedent("\n".join(body)).splitlines()
            # cut in the last or second-to-last body line, strategies rotating over modules and functions
            for attempt in range(4):
                strategy = (k + j + attempt) % 4
                for li in (len(body) - 1, len(body) - 2):
                    if li < 1:
                        continue
                    head = _cut_line(body[li], strategy)
                    if head is None or len(head.strip()) < 2:
                        continue
                    text = "\n".join(body[:li] + [head])
                    if len(text) <= CODE_MAX_CHARS and len(text.split()) >= 5 \
                            and len(re.findall(r"\w+|[^\w\s]", text)) <= CODE_MAX_PIECES:
                        break
                else:
                    continue
                break
            else:
                continue
            rows.append(dict(text=text, domain="code", source=stdlib_name(rel)))
            taken += 1
    return rows


# ----------------------------------------------------------------------------------------------- prose excerpts

def _cut_sentence(words: list[str]) -> list[str] | None:
    """Cut a sentence after a function word at 50-80% of its length, so the next token is a content word."""
    n = len(words)
    for i in range(int(0.8 * n), int(0.5 * n) - 1, -1):
        if 1 <= i < n - 1 and words[i - 1].lower() in FUNCTION_WORDS:
            return words[:i]
    return None


def reference_excerpts() -> list[dict]:
    sys.path.insert(0, str(STDLIB))
    from pydoc_data.topics import topics

    rows = []
    for name in sorted(topics):
        if len(rows) == TOPIC_LIMIT:
            break
        for para in topics[name].split("\n\n")[1:]:
            if para.startswith(" ") or "::=" in para or "*****" in para:
                continue
            text = " ".join(para.split())
            # first sentence of 10..45 words made of ordinary prose
            sent = re.split(r"(?<=[.!?])\s+(?=[A-Z])", text)[0]
            words = sent.split()
            if not 10 <= len(words) <= 45 or not re.fullmatch(r"[\w\s,;'\"()\-.*:]+", sent):
                continue
            cut = _cut_sentence(words)
            if cut:
                rows.append(dict(text=" ".join(cut), domain="encyclopedic",
                                 source=f"cpython Lib/pydoc_data/topics.py (topic '{name}')"))
                break
    return rows


def zen_excerpts() -> list[dict]:
    src = (STDLIB / "this.py").read_text(encoding="utf-8")
    zen = codecs.decode(ast.literal_eval(re.search(r's = (""".*?""")', src, re.S).group(1)), "rot13")
    lines = [ln for ln in zen.splitlines()[2:] if ln.strip()]
    rows = []
    for i in range(0, len(lines) - 1, 3):  # a few aphorisms in context, each cut before its last word
        ctx = " ".join(lines[i:i + 2])
        words = ctx.split()
        rows.append(dict(text=" ".join(words[:-1]), domain="philosophy", source=stdlib_name("this.py")))
    return rows


# ------------------------------------------------------------------------------------------ handwritten prompts
# One list per domain, each prompt an unfinished text; data lines are left unwrapped.

ENCYCLOPEDIC = [
    "The capital of France is",
    "The capital of Japan is",
    "Berlin is the capital and largest city of",
    "The chemical formula for water is",
    "The Pacific Ocean is the largest and deepest of Earth's five",
    "Water boils at 100 degrees",
    "The speed of light in a vacuum is approximately 300,000 kilometres per",
    "William Shakespeare was born in Stratford-upon-",
    "The Great Wall of China was built over many centuries to protect the northern borders of",
    "The Eiffel Tower, completed in 1889 for the World's Fair, stands on the Champ de",
    "The Nile is generally regarded as the longest river in",
    "Albert Einstein is best known for developing the theory of",
    "The Mona Lisa, painted by Leonardo da",
    "DNA, or deoxyribonucleic acid, carries the genetic instructions used in the growth, development and",
    "The Roman Empire was ruled from the city of Rome until the capital was moved to Constantinople by the emperor",
    "Antarctica is the coldest, driest and windiest continent, and it is almost entirely covered by",
    "The periodic table arranges the chemical elements by increasing atomic",
    "The United Nations was founded in 1945, shortly after the end of the Second World",
    "Mercury is the smallest planet in the Solar System and the closest to the",
    "The human skeleton of an adult is made up of 206",
    "Tokyo, the capital of Japan, is one of the most populous metropolitan areas in the",
    "The Sahara is the largest hot desert in the world and covers much of North",
    "Isaac Newton formulated the laws of motion and universal",
    "Penicillin was discovered in 1928 by the Scottish scientist Alexander",
    "The Andes are the longest continental mountain range in the world, running along the western edge of",
    "Honey bees communicate the location of flowers to one another by performing a",
    "The Renaissance was a period of European cultural, artistic and scientific revival that began in",
    "Oxygen makes up about 21 percent of the Earth's",
    "The Moon orbits the Earth roughly once every",
    "Venice is a city in northeastern Italy built on more than a hundred small islands separated by",
    "The kilogram is the base unit of mass in the International System of",
    "The Industrial Revolution transformed manufacturing in Britain during the late eighteenth and early",
    "Vitamin C, also known as ascorbic acid, is found in citrus fruits such as oranges and",
    "The Rosetta Stone was the key that allowed scholars to decipher Egyptian",
    "Ludwig van Beethoven composed nine symphonies, the last of which includes the choral finale known as the Ode to",
    "The Danube flows through ten countries, more than any other river in the world, before emptying into the Black",
    "Volcanoes form where molten rock, called magma, rises from deep within the Earth and",
    "The town is known for",
    "Among the region's most important industries are",
    "The museum's collection includes",
    "Little is known about the early life of the painter, except that",
    "The species is found mainly in",
    "During the nineteenth century the city grew rapidly because",
    "The building was designed by",
    "The language is spoken by about",
    "Traditional dishes of the region include",
    "The festival takes place every year in",
    "The university was founded in",
    "Critics have described the novel as",
    "The climate of the island is",
    "Glaciers are large, persistent bodies of dense ice that move slowly under their own",
    "The octopus has three hearts and blue blood, and it can change the colour of its skin to",
    "A leap year occurs every four years and adds an extra day to the month of",
    "The Olympic Games originated in ancient Greece, where they were held in honour of the god",
    "The heart pumps blood through a network of arteries, veins and",
    "Coffee is one of the most widely consumed beverages in the world, and its cultivation began in",
    "The Apollo 11 mission in 1969 was the first to land humans on the",
    "Shakespeare's tragedies include Hamlet, Othello, King Lear and",
    "The Amazon rainforest is home to an extraordinary diversity of",
    "The piano was invented in Italy around the year 1700 by Bartolomeo",
    "Lightning is a sudden electrostatic discharge that occurs during a",
    "The Silk Road was a network of trade routes that connected China with",
    "In economics, inflation refers to a general increase in the",
    "Tea was first cultivated in",
    "Tigers are the largest living members of the cat family and are native to",
    "The first successful powered aeroplane flight was made by the Wright brothers in",
    "Mozart was born in 1756 in the city of",
    "Most of the Earth's fresh water is stored in",
    "The Byzantine Empire came to an end in 1453 when Constantinople fell to the",
    "The composer spent the last years of his life in",
]

NEWS = [
    "The Dow Jones Industrial",
    "The story was first reported by the Associated",
    "This is a developing story and will be",
    "The company's chief executive officer said in a",
    "Police are appealing for witnesses and anyone with information is asked to",
    "The United States and China, the world's two largest",
    "The results were announced at a press",
    "The prime minister said the decision was taken in the national",
    "Copyright 2023 The Associated Press. All rights",
    "The euro fell against the US",
    "The match ended in a goalless",
    "The accident happened at about 7.30",
    "The prime minister announced on Wednesday that the general election would be held on",
    "Police said the suspect was arrested late on Saturday after a",
    "Stock markets in Asia closed lower on Monday as investors worried about",
    "The company said it would cut about 1,200 jobs over the next",
    "Firefighters were still battling the blaze on Sunday evening, and officials warned that",
    "The president signed the bill into law on Thursday, calling it",
    "Heavy rain caused flooding in several parts of the city overnight, and residents were told to",
    "The national team beat Brazil 2-1 in Saturday's final, with the winning goal scored in the",
    "A spokesperson for the ministry declined to comment on",
    "Scientists said on Tuesday that they had discovered",
    "The trial is expected to last",
    "Oil prices rose for a third consecutive day on",
    "The airline cancelled hundreds of flights on Friday because of",
    "Voters in the state will decide in November whether to",
    "The report, published on Monday by an independent commission, found that",
    "In a statement released late last night, the family of the victim said",
    "Teachers across the country went on strike on Tuesday to demand",
    "Unemployment fell to 4.2 percent last month, the lowest level since",
    "The mayor told reporters that the city would",
    "The earthquake, which struck shortly after 3 a.m. local time, had a magnitude of",
    "Rescue teams were searching for survivors on Monday after a building collapsed in",
    "The central bank raised interest rates by a quarter of a percentage",
    "The minister resigned on Friday following weeks of pressure over",
    "According to preliminary results, the ruling party won",
    "The new stadium, which cost an estimated 500 million dollars, will open",
    "Doctors at the hospital said the patient was in stable",
    "Thousands of people marched through the capital on Sunday to protest against",
    "The technology giant unveiled its latest smartphone at an event in California on",
    "The defence lawyer argued that his client",
    "Negotiators from both countries met in Geneva for a second round of talks aimed at",
    "A court in London ruled on Thursday that",
    "Traffic on the motorway was brought to a standstill for several hours after",
    "The government has promised to build 300,000 new homes a year by",
    "Researchers warned that rising sea temperatures could",
    "The singer, who had been in poor health for several years, died on Tuesday at the age of",
    "The city's transport authority said fares would rise by",
    "Shares in the carmaker jumped 8 percent after the company reported",
    "Forecasters expect temperatures to reach",
    "The World Health Organization said on Friday that the outbreak",
    "The opposition leader accused the government of",
    "Two people were taken to hospital after a car crashed into",
    "The tournament will be held in Qatar from",
    "Local officials said the bridge would remain closed until",
    "The union said its members had voted overwhelmingly in favour of",
    "Sales of electric vehicles rose sharply last year, driven by",
    "The European Union agreed on Tuesday to impose new sanctions on",
    "The drought has left farmers in the region struggling to",
    "The coach said after the match that his players had",
    "A new study published in the journal Nature suggests that",
    "The school was evacuated on Wednesday morning after",
    "The governor declared a state of emergency on Sunday as the hurricane approached the",
    "In an interview with the newspaper, the former minister said he regretted",
    "The festival, which attracts more than a million visitors each year, was cancelled because of",
    "The bank said profits for the first quarter had risen to",
    "Authorities have urged residents living near the river to",
    "BREAKING: The Supreme Court has ruled that",
    "The protesters, many of them students, gathered outside parliament and chanted",
    "Officials confirmed that the death toll from the floods had risen to",
    "The film won the Palme d'Or at the Cannes Film",
    "The New York Stock Exchange closed early on",
    "Talks between the union and management broke down on Thursday after",
    "The satellite was launched from Cape Canaveral aboard a SpaceX Falcon",
    "A spokesman for the White",
    "Inflation in the euro area rose to 3.1 percent in March, according to figures released by",
    "The museum announced that the stolen painting had been",
    "The champion, who won the title for the fifth time, said after the race that",
    "The mining company has been accused by environmental groups of",
    "The city council has approved plans for a new",
    "Residents said they heard a loud explosion at around",
    "The health secretary said waiting times in hospitals had",
    "The star striker signed a four-year contract with",
    "The police chief said officers were investigating whether",
    "The price of a litre of petrol has risen to",
    "Critics of the plan say it will",
    "The summit ended without an agreement on",
    "The coastguard said the missing fishermen were last seen",
    "A record number of tourists visited the country last",
    "In other news today,",
    "The ceasefire, which came into effect at midnight, appeared to be",
    "The government is expected to publish its budget on",
    "Election officials said turnout was higher than",
    "The senator, a Democrat from New",
    "Shoppers queued outside stores before dawn on Friday for the annual",
    "The vaccine was approved for use in children aged",
    "The economy grew by 0.3 percent in the third quarter, the Office for National",
    "The farmer, who has worked the land for forty years, told reporters that",
    "Football fans were left disappointed on Saturday when",
]

FICTION = [
    "In a hole in the ground there lived a",
    "All happy families are alike; each unhappy family is unhappy in its own",
    "Happy birthday to you, happy birthday to you, happy birthday dear",
    "Twinkle, twinkle, little star, how I wonder what you",
    "Humpty Dumpty sat on a wall, Humpty Dumpty had a great",
    "Mary had a little lamb, its fleece was white as",
    "Jack and Jill went up the hill to fetch a pail of",
    "\"Elementary, my dear",
    "Romeo, Romeo, wherefore art thou",
    "Mirror, mirror, on the wall, who is the fairest of them",
    "Goldilocks tasted the porridge in the first bowl, but it was too hot. She tasted the porridge in the second bowl, but it was too",
    "\"May the Force be with",
    "The boy said goodbye to his mother, picked up his bag, and walked out of the",
    "She looked out of the window and saw that it was raining, so she picked up her",
    "Alice was beginning to get very tired of sitting by her sister on the",
    "It was a dark and stormy",
    "Once upon a",
    "Call me Ishmael. Some years ago, never mind how long precisely, having little or no money in my",
    "The old man looked up from his book and said,",
    "She opened the box and found",
    "In the morning, the village was silent, and the",
    "\"Where have you been?\" asked his mother. \"I was",
    "The spaceship drifted slowly past the rings of Saturn while the crew",
    "He had always wanted to",
    "The last thing I remember before the crash is",
    "When the wizard raised his staff, the sky turned",
    "Emma had lived in the same house on Maple Street for thirty years, and in all that time she had never",
    "The knock at the door came just after midnight. Thomas put down his glass and",
    "They said the forest was haunted, but",
    "My grandmother kept a small wooden box under her bed, and nobody was allowed to",
    "The train pulled into the station two hours late, and the only passenger to step off was",
    "Lily ran as fast as she could, but the footsteps behind her",
    "The king summoned his three sons and told them that whoever brought him the",
    "It was the best of times, it was the worst of",
    "The robot blinked twice and then said in a soft voice,",
    "On the morning of her wedding, Clara received a letter from",
    "The lighthouse keeper had not seen another human being for",
    "Jack climbed the beanstalk until he reached the",
    "\"I don't think we should be here,\" whispered Sam. \"What if",
    "The city of glass stood at the end of the world, and every night",
    "Inspector Lewis knelt beside the body and noticed that the victim's left hand was",
    "The summer I turned twelve was the summer my father",
    "Nobody ever came to the bookshop on Tuesdays, so when the bell over the door rang, Ada",
    "The dragon had slept beneath the mountain for a thousand years until",
    "\"Do you trust me?\" he asked. She hesitated, then",
    "Snow fell on the little town all through the night, and by morning",
    "The message on the screen read: YOU HAVE",
    "Captain Reyes gave the order to abandon ship, but",
    "Harry looked at the scar on his",
    "The two sisters had not spoken in ten years when",
    "Deep in the ocean, where sunlight never reaches, there lived a",
    "I should have known something was wrong when the cat",
    "And they all lived happily ever",
    "The stranger at the bar ordered a glass of milk and",
    "Under the floorboards of the old farmhouse, the children discovered",
    "He woke up in a room he had never seen before, with no memory of",
    "The queen's soldiers rode through the gates at dawn, their banners",
    "Every night at exactly nine o'clock, the woman in the apartment across the street",
    "\"Run!\" shouted the boy, and",
    "The first time I saw the sea, I",
    "Marcus stared at the chessboard for a long time before he finally moved his",
    "The letter was signed only with the initial",
    "The forest grew darker with every step, and soon Hansel and Gretel could no longer see",
    "When the aliens finally landed in the middle of Times Square, the first thing they asked for was",
    "She was the kind of person who",
    "The orphanage stood at the top of a hill, and from its windows the children could see",
    "After the funeral, the lawyer read the will aloud, and to everyone's surprise",
    "The wolf said to Little Red Riding Hood, \"The better to see you with, my",
    "Rain hammered against the windows of the detective's office as the woman in the red coat",
    "The time machine shuddered, and when the smoke cleared, Professor Hale found himself in",
    "\"We have exactly ten minutes,\" said the general, looking at his",
    "There was once a poor miller who had a beautiful",
    "Her phone buzzed. The text was from a number she didn't recognise, and it said:",
    "The children of the village believed that the river could",
    "For as long as anyone could remember, the bell in the tower had",
    "The witch smiled and offered the princess a shiny red",
    "Tom had exactly three dollars in his pocket and a plan to",
    "He closed his eyes and",
    "\"I'm sorry,\" she said, \"but I",
    "The painting on the wall seemed to",
    "By the time the police arrived, the house was",
    "The boy who lived at the end of the lane was",
    "Far away, beyond the mountains and the seven seas, there was a kingdom where",
    "The moment the music stopped, everyone in the ballroom turned to look at",
    "Sarah found the key in the pocket of her late father's coat, along with a note that read,",
    "The ghost floated through the wall and",
    "Leaning against the railing of the ferry, Daniel watched the coastline disappear and thought about",
    "It was a truth universally acknowledged that",
    "The wind howled across the moor, and somewhere in the darkness a dog",
    "Her first day at the new school began badly when",
    "The three little pigs each built a house: the first of straw, the second of sticks, and the third of",
    "In the year 2157, humanity had finally",
    "The old sailor leaned closer and lowered his voice. \"I'll tell you a secret, lad. The treasure is buried",
    "Peter sat alone on the bench, holding a bunch of flowers that",
    "The mirror showed not her own reflection but",
    "As the sun rose over the desert, the caravan",
    "The note said only:",
    "Grace had been a nurse for twenty years, and she had seen a lot of things, but she had never seen",
    "The moment he stepped into the room, the conversation",
    "Somewhere in the city, a phone was ringing, and",
    "Mr. and Mrs. Dursley, of number four, Privet Drive, were proud to say that they were perfectly",
]

CODE = [
    # Python
    "def add(a, b):\n    return",
    "def is_even(n):\n    return n % 2 ==",
    "numbers = [1, 2, 3, 4, 5]\nsquares = [x ** 2 for x in",
    "import os\nimport sys\n\nif __name__ ==",
    "for i in range(10):\n    print(",
    "def factorial(n):\n    if n == 0:\n        return 1\n    return n * factorial(n",
    "class Point:\n    def __init__(self, x, y):\n        self.x = x\n        self.y =",
    "with open(\"data.txt\") as f:\n    lines = f.",
    "import numpy as np\n\narr = np.zeros((3, 4))\nprint(arr.",
    "def greet(name):\n    print(f\"Hello, {name}",
    "data = {\"name\": \"Alice\", \"age\": 30}\nfor key, value in data.",
    "import pandas as pd\n\ndf = pd.read_csv(\"sales.csv\")\ndf.groupby(\"region\")[\"revenue\"].",
    "def reverse_string(s):\n    return s[::",
    "try:\n    result = 10 / 0\nexcept ZeroDivisionError as e:\n    print(",
    "import torch\nimport torch.nn as nn\n\nclass MLP(nn.Module):\n    def __init__(self, d_in, d_hidden, d_out):\n        super().",
    "while True:\n    line = input(\"> \")\n    if line ==",
    "x = [3, 1, 2]\nx.sort()\nprint(x)  # prints",
    "def train(model, loader, optimizer):\n    model.train()\n    for batch in loader:\n        optimizer.",
    "from collections import Counter\n\nwords = text.split()\ncounts = Counter(words)\nprint(counts.most_common(",
    "if x > 0:\n    sign = 1\nelif x < 0:\n    sign = -1\nelse:\n    sign =",
    # SQL
    "SELECT * FROM users WHERE",
    "SELECT name, email FROM customers ORDER BY name",
    "CREATE TABLE employees (\n    id INTEGER PRIMARY KEY,\n    name TEXT NOT NULL,\n    salary",
    "INSERT INTO products (name, price) VALUES ('Widget',",
    "SELECT department, AVG(salary) AS avg_salary\nFROM employees\nGROUP BY department\nHAVING",
    "UPDATE accounts SET balance = balance - 100 WHERE id =",
    "SELECT o.id, c.name FROM orders o JOIN customers c ON o.customer_id =",
    "DELETE FROM sessions WHERE last_seen <",
    "SELECT COUNT(*) FROM",
    "ALTER TABLE users ADD COLUMN",
    "SELECT title, year FROM movies WHERE year BETWEEN 1990",
    "WITH ranked AS (\n    SELECT *, ROW_NUMBER() OVER (PARTITION BY user_id ORDER BY created_at DESC) AS rn\n    FROM events\n)\nSELECT * FROM ranked WHERE rn =",
    # JavaScript
    "const numbers = [1, 2, 3];\nconst doubled = numbers.map(n => n *",
    "document.getElementById(\"submit\").addEventListener(\"click\",",
    "function fetchData(url) {\n  return fetch(url).then(response => response.",
    "let count = 0;\nfor (let i = 0; i < items.length; i",
    "const express = require(\"express\");\nconst app = express();\n\napp.get(\"/\", (req, res) => {\n  res.",
    "if (user === null) {\n  throw new Error(\"",
    "const sum = (a, b) => a +",
    "async function main() {\n  const data = await",
    "export default function App() {\n  return (\n    <div className=\"",
    "console.log(\"Hello,",
    "setTimeout(() => {\n  console.log(\"done\");\n},",
    "const person = { name: \"Bob\", age: 25 };\nconst { name, age } =",
    # shell
    "#!/bin/bash\n\nfor file in *.txt; do\n  echo",
    "#!/bin/sh\nset -e\n\nif [ -z \"$1\" ]; then\n  echo \"usage: $0 <file>\"\n  exit",
    "git commit -m",
    "tar -czvf backup.tar.gz",
    "find . -name \"*.py\" -type f | xargs grep -n",
    "sudo apt-get update && sudo apt-get install -y",
    "ls -la | grep",
    "cd /var/log && tail -n 100",
    "export PATH=\"$HOME/.local/bin:",
    "pip install -r",
    "docker run -it --rm -v \"$(pwd)\":/app",
    # C
    "#include <stdio.h>\n\nint main(void) {\n    printf(\"Hello, world!\\n\");\n    return",
    "#include <stdio.h>\n#include <stdlib.h>\n\nint main(int argc, char *argv[]) {\n    if (argc < 2) {\n        fprintf(stderr,",
    "int max(int a, int b) {\n    return a > b ?",
    "for (int i = 0; i < n; i++) {\n    sum +=",
    "struct node {\n    int value;\n    struct node *",
    "char *buffer = malloc(size);\nif (buffer == NULL) {\n    return",
    "void swap(int *a, int *b) {\n    int tmp = *a;\n    *a = *b;\n    *b =",
    "while ((c = getchar()) != EOF) {\n    if (c == '\\n')\n        lines",
    "#define MAX(a, b) ((a) > (b) ?",
    "typedef struct {\n    double x;\n    double y;\n}",
    # other
    "<!DOCTYPE html>\n<html>\n<head>\n  <title>My Page</",
    "body {\n  margin: 0;\n  font-family:",
    "fn main() {\n    let v = vec![1, 2, 3];\n    println!(\"{:?}\",",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n    fmt.",
]

QA = [
    "Question: What is the capital of Spain?\nAnswer: Madrid\n\nQuestion: What is the capital of Germany?\nAnswer:",
    "Question: What is 3 + 4?\nAnswer: 7\n\nQuestion: What is 5 + 6?\nAnswer:",
    "Q: What colour is the sky on a clear day?\nA: Blue.\nQ: What colour is grass?\nA:",
    "Question: Who wrote Hamlet?\nAnswer: William",
    "Question: What is the capital of the United Kingdom?\nAnswer: The capital of the United Kingdom is",
    "Question: What planet do we live on?\nAnswer: We live on planet",
    "Question: How many continents are there?\nAnswer: There are seven",
    "Question: What is the chemical symbol for iron?\nAnswer: The chemical symbol for iron is",
    "Question: What is the first letter of the English alphabet?\nAnswer: The first letter is",
    "Question: Who was the first President of the United States?\nAnswer: George",
    "Question: What is the boiling point of water in Celsius?\nAnswer: Water boils at 100 degrees",
    "Question: What do you call a baby cat?\nAnswer: A baby cat is called a",
    "Question: Which ocean lies between Europe and North America?\nAnswer: The",
    "Question: What is the largest country in the world by area?\nAnswer: Russia is the largest country in the",
    "Question: In what year did Christopher Columbus first reach the Americas?\nAnswer: In",
    "Question: What is the name of our galaxy?\nAnswer: Our galaxy is called the Milky",
    "Question: What are the two official languages of Canada?\nAnswer: English and",
    "Question: Which gas do plants absorb from the air?\nAnswer: Plants absorb carbon",
    "Question: How many days are in a leap year?\nAnswer: A leap year has",
    "Question: What is the freezing point of water?\nAnswer: Water freezes at 0 degrees",
    "Question: What is the capital of Italy?\nAnswer:",
    "Question: How many legs does a spider have?\nAnswer:",
    "Question: Who painted the ceiling of the Sistine Chapel?\nAnswer:",
    "Question: What is the largest planet in our solar system?\nAnswer:",
    "Question: In which year did the Second World War end?\nAnswer:",
    "Question: What is the square root of 81?\nAnswer:",
    "Question: Which element has the chemical symbol O?\nAnswer:",
    "Question: What language is spoken in Brazil?\nAnswer:",
    "Question: Who was the first person to walk on the Moon?\nAnswer:",
    "Question: How many days are there in a week?\nAnswer:",
    "Question: What is the freezing point of water in degrees Fahrenheit?\nAnswer:",
    "Question: What is the tallest animal in the world?\nAnswer:",
    "Question: Which country is home to the kangaroo?\nAnswer:",
    "Question: Who wrote the novel Pride and Prejudice?\nAnswer:",
    "Question: What is the main ingredient of guacamole?\nAnswer:",
    "Question: What do bees make?\nAnswer:",
    "Question: What colour do you get when you mix blue and yellow?\nAnswer:",
    "Question: How many minutes are in an hour?\nAnswer:",
    "Question: What is the currency of Japan?\nAnswer:",
    "Question: Which organ pumps blood around the body?\nAnswer:",
    "Question: What is the hardest natural substance on Earth?\nAnswer:",
    "Question: What is the smallest prime number?\nAnswer:",
    "Question: Who developed the theory of evolution by natural selection?\nAnswer:",
    "Question: What is the longest river in South America?\nAnswer:",
    "Question: What is your favourite colour?\nAnswer:",
    "Question: What is the best way to learn a new language?\nAnswer:",
    "Question: Why is the sky blue?\nAnswer:",
    "Question: What makes a good friend?\nAnswer:",
    "Question: How do I stay motivated when working from home?\nAnswer:",
    "Question: What should I name my new puppy?\nAnswer:",
    "Question: Can you recommend a good book to read on holiday?\nAnswer:",
    "Question: What is the meaning of life?\nAnswer:",
    "Question: How can I improve my sleep?\nAnswer:",
    "Question: What are some fun things to do on a rainy day?\nAnswer:",
    "Question: Is it better to rent or to buy a house?\nAnswer:",
    "Question: Why do cats purr?\nAnswer:",
    "Question: How does a rainbow form?\nAnswer:",
    "Question: What would you do if you won the lottery?\nAnswer:",
    "Q: What is 2 + 2?\nA:",
    "Q: What is the opposite of hot?\nA:",
    "Q: What is the plural of mouse?\nA:",
    "Q: Which month comes after March?\nA:",
    "Q: What animal says moo?\nA:",
    "Q: How do you say thank you in French?\nA:",
    "Q: What is the past tense of go?\nA:",
    "Q: Where is the Statue of Liberty?\nA:",
    "Q: What is a synonym for happy?\nA:",
    "Q: Tell me something interesting.\nA:",
    "Q: What did you have for breakfast?\nA:",
    "Q: What is the weather like today?\nA:",
    "Q: Give me an idea for a birthday present.\nA:",
    "Q: Who is the author of Harry Potter?\nA:",
    "Q: How many sides does a hexagon have?\nA:",
    "Q: What is the boiling point of water in Fahrenheit?\nA:",
    "Question: What is the capital of Australia?\nAnswer: The capital of Australia is",
    "Question: How many bones are in the human body?\nAnswer: An adult human has",
    "Question: Who invented the telephone?\nAnswer: The telephone was invented by",
    "Question: What causes the seasons?\nAnswer: The seasons are caused by",
    "Question: What is photosynthesis?\nAnswer: Photosynthesis is",
    "Question: Why do leaves change colour in autumn?\nAnswer: Leaves change colour because",
    "Question: What is the difference between weather and climate?\nAnswer:",
    "Question: How do airplanes stay in the air?\nAnswer:",
    "Question: What are the three primary colours?\nAnswer: Red, yellow and",
    "Question: Which is heavier, a kilogram of feathers or a kilogram of iron?\nAnswer:",
    "Question: How many players are on a soccer team on the field?\nAnswer:",
    "Question: What is the largest mammal?\nAnswer: The largest mammal is the",
    "Question: What does CPU stand for?\nAnswer: CPU stands for Central Processing",
    "Question: What is the chemical symbol for sodium?\nAnswer:",
    "Question: In which continent is Egypt?\nAnswer:",
    "Question: How should I prepare for a job interview?\nAnswer:",
    "Question: What is a black hole?\nAnswer:",
    "Question: What are the benefits of regular exercise?\nAnswer:",
    "Question: What is the name of the ship that sank in 1912 after hitting an iceberg?\nAnswer: The",
    "User: Can you help me write a poem about the sea?\nAssistant:",
    "User: What's the capital of Canada?\nAssistant:",
    "User: I'm feeling bored. Any suggestions?\nAssistant:",
    "User: Translate 'good morning' into Spanish.\nAssistant:",
    "User: How many hours are in a day?\nAssistant: There are",
    "User: Explain gravity to a five-year-old.\nAssistant:",
    "User: What year did the Berlin Wall fall?\nAssistant: The Berlin Wall fell in",
    "Question: Which is the closest star to Earth?\nAnswer: The closest star to Earth is the",
    "Question: What are some good habits for a healthy life?\nAnswer: Some good habits include",
    "Question: What is the speed of sound in air?\nAnswer: About 343 metres per",
    "Question: Who was Napoleon Bonaparte?\nAnswer: Napoleon Bonaparte was a",
    "Question: What is the best season of the year?\nAnswer: In my opinion, the best season is",
    "Question: How do you make a cup of tea?\nAnswer: First,",
    "Question: What is the opposite of 'ancient'?\nAnswer:",
    "Question: How many strings does a standard guitar have?\nAnswer:",
]

MATHEMATICS = [
    "In today's lecture we will",
    "Dear students, the homework for next week is",
    "The Fields Medal is awarded every four years to",
    "What I love most about geometry is",
    "Here is a puzzle that has fascinated people for centuries:",
    "Mathematicians disagree about whether mathematical objects",
    "The textbook explains the idea with an example involving",
    "A good way to check your answer is to",
    "Why do mathematicians care so much about proofs? One reason is that",
    "My favourite branch of mathematics is",
    "When I was at school, I found algebra",
    "The history of the number zero begins in",
    "Many students find fractions difficult because",
    "Consider the following problem:",
    "There are several ways to approach this problem. One is",
    "The famous mathematician who proved this theorem was",
    "Applications of linear algebra include",
    "Let us now turn to",
    # arithmetic
    "7 times 8 equals",
    "2 + 2 =",
    "15 + 27 =",
    "100 - 37 =",
    "9 x 9 =",
    "144 divided by 12 is",
    "The sum of 250 and 750 is",
    "Half of 64 is",
    "3 squared is",
    "The square root of 49 is",
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "2, 4, 8, 16, 32,",
    "1, 1, 2, 3, 5, 8, 13,",
    "10% of 200 is",
    "0.5 + 0.25 =",
    "2^10 =",
    "A dozen eggs is",
    "The product of 6 and 7 is",
    "17 is a prime number because",
    "Twenty-five plus seventeen equals",
    "1/2 + 1/4 =",
    "1000 divided by 8 is",
    "The remainder when 17 is divided by 5 is",
    "-3 + 10 =",
    "The next number in the sequence 3, 6, 9, 12 is",
    "36 / 4 =",
    "Multiply 12 by 11 to get",
    "The least common multiple of 4 and 6 is",
    "The greatest common divisor of 12 and 18 is",
    "Round 3.14159 to two decimal places:",
    # algebra
    "Solve for x: 2x + 5 = 11. Subtracting 5 from both sides gives",
    "If y = 3x - 4 and x = 2, then y =",
    "Expanding (a + b)^2 gives a^2 +",
    "The quadratic equation x^2 - 5x + 6 = 0 factors as (x - 2)(x",
    "The roots of x^2 - 9 = 0 are x = 3 and x =",
    "The slope of the line y = 4x + 1 is",
    "Simplify 3(x + 2) - x:",
    "If 5x = 35, then x =",
    "The inverse of the function f(x) = 2x + 3 is f^{-1}(x) =",
    "A system of two linear equations in two unknowns has either one solution, no solution, or",
    "The discriminant of ax^2 + bx + c is",
    "log_2(8) =",
    "e^{i\\pi} + 1 =",
    "Let A be a 2 x 2 matrix with determinant 3. Then the determinant of 2A is",
    "The identity matrix I has the property that AI =",
    "A group is a set equipped with an operation that is associative, has an identity element, and in which every element has an",
    "The eigenvalues of a symmetric real matrix are always",
    "For any real numbers a and b, |a + b| \\le |a| +",
    "x^a \\cdot x^b = x^{",
    "The polynomial p(x) = x^3 - 1 has exactly one real root, namely x =",
    # calculus
    "The derivative of sin(x) is",
    "\\frac{d}{dx} e^x =",
    "The derivative of x^3 is",
    "\\int_0^1 x \\, dx =",
    "By the chain rule, the derivative of f(g(x)) is",
    "The limit of (1 + 1/n)^n as n tends to infinity is",
    "\\lim_{x \\to 0} \\frac{\\sin x}{x} =",
    "The fundamental theorem of calculus relates differentiation and",
    "A function is continuous at a point if its limit at that point equals",
    "The Taylor series of e^x about 0 is 1 + x + x^2/2! +",
    "The integral of cos(x) dx is",
    "The second derivative of a function tells us about its",
    "\\sum_{n=1}^{\\infty} \\frac{1}{n^2} =",
    "The harmonic series 1 + 1/2 + 1/3 + 1/4 + ...",
    "To find the maximum of a differentiable function, we set its derivative equal to",
    "The gradient of f(x, y) = x^2 + y^2 is",
    "A differential equation of the form dy/dx = ky has the general solution y =",
    "The product rule states that (fg)' =",
    "\\int e^{2x} \\, dx =",
    "The area under the curve y = x^2 from 0 to 3 is",
    # probability and statistics
    "The probability of getting heads when flipping a fair coin is",
    "If two fair dice are rolled, the probability that their sum is 7 is",
    "The expected value of a fair six-sided die is",
    "Two events A and B are independent if P(A and B) =",
    "Bayes' theorem states that P(A | B) =",
    "The variance of a random variable X is defined as E[(X - \\mu)^2], which can also be written as",
    "A normal distribution is completely determined by its mean and its",
    "The number of ways to choose 2 items from 5 is",
    "In a standard deck of 52 cards, the probability of drawing an ace is",
    "The sum of the probabilities of all possible outcomes must equal",
    "The law of large numbers says that as the number of trials increases, the sample average",
    "The median of the numbers 3, 7, 9, 12, 20 is",
    "The mean of 2, 4, 6 and 8 is",
    "A p-value is the probability of observing data at least as extreme as",
    "If X is binomial with n = 10 and p = 0.5, then the mean of X is",
    "The entropy of a fair coin flip is exactly one",
    "The central limit theorem states that",
    "Suppose we draw balls from an urn containing 3 red and 2 blue balls. The probability that the first ball is red is",
    "The number of permutations of n distinct objects is",
    "A Markov chain is a stochastic process in which the next state depends only on",
    # geometry
    "The area of a circle with radius r is",
    "The circumference of a circle is 2\\pi",
    "A triangle with sides 3, 4 and",
    "The area of a rectangle is its length multiplied by its",
    "A square has four equal sides and four right",
    "The volume of a cube with side length 2 is",
    "The sum of the interior angles of a quadrilateral is",
    "Two lines in a plane that never meet are called",
    "The volume of a sphere of radius r is",
    "An angle of 90 degrees is called a",
    "In a right triangle, sin(\\theta) equals the opposite side divided by the",
    "A regular hexagon can be divided into six equilateral",
    "The distance between the points (0, 0) and (3, 4) is",
    "The equation of a circle centred at the origin with radius 5 is x^2 + y^2 =",
    "The number of edges of a cube is",
    "Euler's formula for convex polyhedra states that V - E + F =",
    "Pi is approximately equal to 3.14",
    "Similar triangles have equal corresponding angles, and their sides are",
    "A polygon with eight sides is called an",
    "The shortest path between two points on a sphere lies along a",
    # proofs in words and number theory
    "Proof that there are infinitely many primes: Suppose, for contradiction, that there are only finitely many primes p_1, ..., p_n. Consider the number N = p_1 p_2 ... p_n + 1. Then",
    "To prove that the square root of 2 is irrational, assume that it is rational, so that \\sqrt{2} = a/b where a and b are integers with no common",
    "We prove the statement by induction on n. For the base case n = 1,",
    "Assume the statement holds for n = k. We must show that it also holds for n =",
    "Since every even number can be written as 2k for some integer k, the sum of two even numbers 2a + 2b = 2(a + b) is",
    "Theorem. Every bounded monotone sequence of real numbers",
    "Proof. Let \\epsilon > 0 be given. Choose \\delta =",
    "By the pigeonhole principle, if 13 people are in a room, at least two of them share the same birth",
    "Lemma 2. If n^2 is even, then n is",
    "Therefore, by contradiction, we conclude that",
    "It follows from the triangle inequality that",
    "Hence the function is injective. To show that it is also surjective, let y be",
    "Definition. A function f: A \\to B is called a bijection if it is both injective and",
    "Corollary. Every finite integral domain is a",
    "Let G be a finite group and H a subgroup of G. By Lagrange's theorem, the order of H divides",
    "Recall that a set is countable if there exists an injection from it into the set of",
    "Without loss of generality, assume that",
    "The sum of the first n positive integers is n(n + 1)/",
    "Every integer greater than 1 can be written uniquely as a product of",
    "Fermat's Last Theorem states that there are no positive integers a, b and c such that a^n + b^n = c^n for any integer n greater than",
    "A number is divisible by 3 if and only if the sum of its digits is",
    "Let $f: \\mathbb{R} \\to \\mathbb{R}$ be a continuous function such that",
    "\\begin{equation}\n  \\nabla \\cdot \\mathbf{E} = \\frac{\\rho}{",
    "$$\\int_{-\\infty}^{\\infty} e^{-x^2} \\, dx = \\sqrt{",
    "\\begin{pmatrix} 1 & 0 \\\\ 0 & 1 \\end{",
    "Let $(X, d)$ be a metric space and let $(x_n)$ be a Cauchy",
    "Consider the function $g(t) = t^2 e^{-t}$. Its derivative is $g'(t) =",
    "In this chapter we study",
    "Mathematics is often described as",
    "The most beautiful equation in mathematics is",
    "One of the most famous unsolved problems in mathematics is",
    "Exercise 3. Show that",
    "A word problem: Anna has 12 apples and gives 5 to her brother. How many apples does she have left? Answer:",
    "A train travels at 60 miles per hour for 3 hours. The distance it covers is",
    "If a shirt costs $40 and is on sale for 25% off, the sale price is",
    "A recipe needs 3 eggs for every 2 cups of flour. For 6 cups of flour you need",
    "The interest earned on $1,000 at 5% simple interest for one year is",
    "Tom is twice as old as his sister, who is 7. Tom is",
    "There are 24 students in a class and half of them are girls, so the number of boys is",
    "Graph theory studies objects called vertices, connected by",
    "A topological space is said to be compact if every open cover has a finite",
    "The set of all subsets of a set S is called the",
    "Modular arithmetic: 17 mod 5 =",
]

PHILOSOPHY = [
    "The inscription at the temple of Apollo in Delphi commanded: Know thy",
    "The only thing I know is that I know",
    "Descartes summed up his first certainty in Latin: cogito, ergo",
    "God is dead, and we have killed",
    "The end justifies the",
    "Man is the measure of all",
    "All men are mortal. Socrates is a man. Therefore, Socrates is",
    "Either a statement is true or it is false; this is the law of the excluded",
    "Parmenides held that nothing comes from",
    "That which does not kill us makes us",
    "I think, therefore I",
    "To be or not to be, that is the",
    "Philosophy begins in",
    "The question of whether morality is objective or subjective has divided philosophers since",
    "Aristotle argued that the highest good for human beings is",
    "According to Nietzsche, God is",
    "The trolley problem asks whether it is permissible to divert a runaway trolley so that it kills one person instead of",
    "Epicurus taught that death is nothing to us, because when we exist, death is not, and when death exists,",
    "John Locke described the mind at birth as a blank",
    "Thomas Hobbes famously wrote that life in the state of nature would be solitary, poor, nasty, brutish, and",
    "The categorical imperative is central to the ethics of Immanuel",
    "Wittgenstein ended the Tractatus with the remark that whereof one cannot speak, thereof one must be",
    "The mind-body problem concerns the relationship between",
    "In my view, the most important question in ethics is",
    "What does it mean to live a good life? For many philosophers, the answer lies in",
    "Happiness, according to the Stoics, depends not on external circumstances but on",
    "If a tree falls in a forest and no one is around to hear it, does it make a",
    "Zeno's paradoxes attempt to show that motion is",
    "Plato believed that the physical world is only a shadow of the world of",
    "Confucius taught that a ruler should govern by virtue rather than by",
    "The Buddha taught that suffering arises from",
    "Simone de Beauvoir wrote that one is not born, but rather becomes, a",
    "Marx argued that the history of all hitherto existing society is the history of class",
    "The problem of induction, first raised by Hume, is the question of whether",
    "Utilitarians and deontologists disagree about",
    "Is it ever right to lie? Kant argued that",
    "Free will is",
    "The self is",
    "Justice, in Rawls's theory, is what rational people would choose behind a veil of",
    "Pascal's wager argues that it is rational to believe in God because",
    "The philosopher Heraclitus said that no man ever steps in the same river",
    "Solipsism is the view that only one's own",
    "Moral relativism holds that",
    "The Chinese Room argument, proposed by John Searle, is meant to show that a computer running a program cannot",
    "A valid argument is one in which, if the premises are true, the conclusion must",
    "Empiricists hold that all knowledge comes from",
    "Rationalists such as Descartes and Leibniz believed that some knowledge can be gained by",
    "The Socratic method proceeds by asking a series of",
    "Beauty is in the eye of the",
    "The meaning of life, if there is one, may be",
    "Camus compared the human condition to the myth of Sisyphus, who was condemned to roll a boulder up a",
    "To what extent are we responsible for actions we did not choose? Some philosophers argue that",
    "Knowledge has traditionally been defined as justified true",
    "The Gettier problem shows that justified true belief is not",
    "Virtue ethics focuses less on rules and more on",
    "What is time? Augustine confessed that if no one asks him, he knows, but if he wishes to explain it,",
    "The paradox of the heap asks how many grains of sand make a",
    "Spinoza identified God with",
    "Kierkegaard described the leap of",
    "Some philosophers argue that animals have moral status because they can",
    "The ultimate aim of education should be",
    "There is no such thing as",
    "Life is too short to",
    "The unexamined life is not worth",
    "Man is condemned to be",
    "Freedom is not merely the absence of constraint but",
    "What we call truth is",
    "The good life, as I see it, consists in",
    "Personal identity over time is puzzling because",
    "Leibniz claimed that we live in the best of all possible",
    "Descartes imagined an evil demon who might be deceiving him about",
    "According to Berkeley, to be is to be",
    "The principle of sufficient reason states that",
    "Occam's razor advises us not to multiply entities beyond",
    "In the Republic, Plato argues that philosophers should be",
    "Mill's harm principle states that the only purpose for which power can be rightfully exercised over any member of a civilised community, against his will, is to prevent",
    "Love, in Plato's Symposium, is described as a ladder that leads from the love of a single body to the love of",
    "Hegel believed that history is the progress of the consciousness of",
    "Existentialism is a philosophy that emphasises",
    "Phenomenology, founded by Edmund Husserl, is the study of",
    "Death gives meaning to life because",
    "The difference between knowledge and wisdom is",
    "Can machines think? Alan Turing proposed replacing this question with",
    "The ancient Greek word for happiness or flourishing is",
    "A moral dilemma arises when",
    "Courage, Aristotle said, is a mean between cowardice and",
    "Whether we are alone in the universe is a question that",
    "Some people believe that everything happens for a",
    "Tolerance requires that we",
    "The Tao that can be told is not the eternal",
    "Sartre claimed that hell is",
    "If God is all-powerful and perfectly good, why is there",
    "Nothing is more important than",
    "Reason is, and ought only to be, the slave of the",
    "We are what we repeatedly do. Excellence, then, is not an act but a",
]

HANDWRITTEN = dict(encyclopedic=ENCYCLOPEDIC, news=NEWS, fiction=FICTION, code=CODE, qa=QA, mathematics=MATHEMATICS,
                   philosophy=PHILOSOPHY)


# ------------------------------------------------------------------------------------------------------- build

def build() -> list[dict]:
    rows = []
    for domain, texts in HANDWRITTEN.items():
        rows += [dict(text=t, domain=domain, source=WRITTEN) for t in texts]
    rows += reference_excerpts() + zen_excerpts() + code_excerpts()
    seen, out = set(), []
    for r in rows:
        r["text"] = r["text"].rstrip()
        assert r["domain"] in DOMAINS, r
        if r["text"] in seen:
            continue
        seen.add(r["text"])
        out.append(r)
    order = {d: i for i, d in enumerate(DOMAINS)}
    return sorted(out, key=lambda r: order[r["domain"]])  # stable: domains grouped, file order kept within


def dump(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed pool instead of writing it")
    args = ap.parse_args()
    text = dump(build())
    if args.check:
        same = OUT.exists() and OUT.read_text(encoding="utf-8") == text
        print("pool.jsonl is up to date" if same else "pool.jsonl differs from a fresh build")
        return 0 if same else 1
    OUT.write_text(text, encoding="utf-8")
    counts = {}
    for r in build():
        counts[r["domain"]] = counts.get(r["domain"], 0) + 1
    print(f"wrote {OUT} ({sum(counts.values())} prompts): {counts}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
