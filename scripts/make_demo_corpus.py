#!/usr/bin/env python3
"""Write ``data/demo/corpus.txt``: the caption-style text corpus of the embedded ``demo`` dataset.

The sentences come from a small hand-written grammar (subjects, actions, objects, places and
attributes written for this project; nothing is taken from a caption dataset). Generation is
seeded, so the committed file can be re-made byte for byte::

    python scripts/make_demo_corpus.py            # writes data/demo/corpus.txt
    python scripts/make_demo_corpus.py --check    # exits 1 if the committed file differs

Sentences are lower-case, 6-16 words and de-duplicated. The generator never reads the demo's
reference captions (``data/demo/references.json``): the corpus is independent of them, and
``tests/test_demo.py`` checks that no corpus sentence equals a reference.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "data" / "demo" / "corpus.txt"

# --------------------------------------------------------------------------- morphology

IRREGULAR_PLURALS = {
    "man": "men", "woman": "women", "person": "people", "child": "children", "sheep": "sheep",
    "mouse": "mice", "knife": "knives", "leaf": "leaves", "shelf": "shelves", "foot": "feet",
    "goose": "geese", "fish": "fish", "deer": "deer", "pony": "ponies", "puppy": "puppies",
    "galaxy": "galaxies", "lady": "ladies", "strawberry": "strawberries", "cherry": "cherries",
    "daisy": "daisies", "lily": "lilies", "guy": "guys", "tomato": "tomatoes", "potato": "potatoes",
    "goldfish": "goldfish", "angelfish": "angelfish", "clownfish": "clownfish", "rockfish": "rockfish",
    "jellyfish": "jellyfish",
}
VOWEL_SOUND_EXCEPTIONS_AN = ("hour", "honest")
CONSONANT_SOUND_EXCEPTIONS_A = ("one", "uni", "use", "euro", "ukulele")


def plural(noun: str) -> str:
    """Plural of a noun phrase's head (its last word)."""
    *head, last = noun.split()
    if last in IRREGULAR_PLURALS:
        p = IRREGULAR_PLURALS[last]
    elif last.endswith(("s", "x", "z", "ch", "sh")):
        p = last + "es"
    elif last.endswith("y") and last[-2:-1] not in "aeiou":
        p = last[:-1] + "ies"
    else:
        p = last + "s"
    return " ".join([*head, p])


def art(phrase: str) -> str:
    """``a``/``an`` + phrase, by the sound of its first word."""
    w = phrase.split()[0].lower()
    if w.startswith(VOWEL_SOUND_EXCEPTIONS_AN):
        return "an " + phrase
    if w.startswith(CONSONANT_SOUND_EXCEPTIONS_A):
        return "a " + phrase
    return ("an " if w[0] in "aeiou" else "a ") + phrase


class Verb:
    """A verb with its three forms: base (plural subjects), 3rd person singular, -ing."""

    def __init__(self, base: str, third: str, ing: str):
        self.base, self.third, self.ing = base, third, ing


def V(spec: str) -> Verb:
    base, third, ing = spec.split("/")
    return Verb(base, third, ing)


# --------------------------------------------------------------------------- vocabulary

COLORS = ["red", "blue", "green", "yellow", "white", "black", "gray", "brown", "orange", "pink", "purple", "silver"]
NUMBERS = ["two", "three", "four", "several", "a few", "a couple of", "a group of", "many"]

# people: (noun, pronoun); adjectives that fit people
PEOPLE = [
    ("man", "his"), ("woman", "her"), ("boy", "his"), ("girl", "her"), ("person", "their"),
    ("child", "their"), ("young man", "his"), ("young woman", "her"), ("old man", "his"),
    ("old woman", "her"), ("older man", "his"), ("older woman", "her"), ("elderly woman", "her"),
    ("elderly man", "his"), ("little girl", "her"), ("little boy", "his"), ("lady", "her"),
    ("guy", "his"), ("teenager", "their"), ("photographer", "their"),
    ("officer", "their"), ("tourist", "their"), ("student", "their"), ("pilot", "their"),
    ("soldier", "their"), ("rider", "their"), ("chef", "their"), ("worker", "their"),
]
PERSON_ADJ = ["", "", "", "smiling", "happy", "tall", "serious", "cheerful", "proud"]
KIDS = ("boy", "girl", "child", "little girl", "little boy", "teenager")
AGE_WORDS = ("young", "old", "older", "elderly")

CLOTHES = [
    "an orange space suit", "a white space suit", "a navy uniform", "a military uniform", "a dark uniform",
    "a black suit and tie", "a gray suit", "a dark coat", "a long black coat", "a red jacket",
    "a blue jacket", "a leather jacket", "a white shirt", "a striped shirt", "a baseball cap", "a hat",
    "a black hat", "a navy cap", "glasses", "sunglasses", "a bow tie", "a blue dress", "a red dress",
    "a winter coat", "a scarf", "a helmet", "a hard hat", "jeans and a t shirt", "a green sweater",
]
WITH_FEATURES = [
    "short hair", "long hair", "curly hair", "gray hair", "dark hair", "glasses", "a beard",
    "a big smile", "a hat", "a camera", "a backpack", "an umbrella", "a helmet",
]

PLACES = {
    "street": ["on a city street", "on a busy street", "on a sidewalk", "in a parking lot", "on a quiet road",
               "in front of a shop", "next to a brick wall", "in front of a tall building", "near a bus stop"],
    "nature": ["in a park", "in a grassy field", "in an open field", "near a lake", "by the river", "on the beach",
               "on a hill", "in a garden", "under a blue sky", "near some trees", "on a grassy lawn",
               "in the countryside", "next to a pond", "on a gravel path"],
    "indoor": ["in a kitchen", "in a living room", "in a garage", "in an office", "at a desk", "in a small room",
               "inside a museum", "in a classroom", "in a studio", "in a hallway"],
    "table": ["at a wooden table", "at a cafe", "in a restaurant", "at a kitchen table", "on a patio",
              "at a coffee shop", "at a small table", "at a counter"],
    "portrait": ["in front of a flag", "in front of an american flag", "in front of a gray wall",
                 "in front of a blue background", "next to a flag", "in a studio", "in front of a curtain"],
}
PLACES["outdoor"] = PLACES["street"] + PLACES["nature"]
PLACES["any"] = PLACES["outdoor"] + PLACES["indoor"]

# actions of people: verb, objects, place kinds
PERSON_ACTIONS: list[tuple[Verb, list[str], list[str]]] = [
    (V("ride/rides/riding"), ["a motorcycle", "a red motorcycle", "a bicycle", "a horse", "a scooter",
                              "a skateboard", "a dirt bike", "a brown horse"], ["street", "nature"]),
    (V("hold/holds/holding"), ["a cup of coffee", "a camera", "an umbrella", "a small flag", "a book",
                               "a cell phone", "a bunch of flowers", "a white helmet", "a silver coin",
                               "a sheet of paper", "a cat", "a puppy", "a mug of tea", "a map"], ["any"]),
    (V("drink/drinks/drinking"), ["a cup of coffee", "an espresso", "a glass of water", "a cup of tea",
                                  "a glass of wine", "a mug of coffee", "a glass of juice"], ["table"]),
    (V("eat/eats/eating"), ["a sandwich", "a slice of pizza", "a plate of food", "a piece of cake",
                            "a bowl of soup", "an apple", "a donut", "a bowl of fruit", "breakfast"], ["table"]),
    (V("take/takes/taking"), ["a picture", "a photo of the city", "a picture of a building",
                              "a picture of the sunset", "a photo of some flowers", "a picture with a camera"],
     ["outdoor"]),
    (V("look/looks/looking"), ["through a camera", "at the camera", "at a map", "out of a window",
                               "up at the sky", "at a tall building", "through a telescope", "at the moon",
                               "at a piece of paper", "at an old coin"], ["any"]),
    (V("use/uses/using"), ["a camera on a tripod", "a laptop", "a video camera", "a telescope", "a cell phone",
                           "a pen and paper"], ["any"]),
    (V("wear/wears/wearing"), CLOTHES, ["any", "portrait"]),
    (V("sit/sits/sitting"), ["on a bench", "on a chair", "on the grass", "on a motorcycle", "on a wooden bench",
                             "on a couch", "on the steps", "next to a cat"], ["any"]),
    (V("stand/stands/standing"), ["next to a motorcycle", "beside a horse", "next to a flag", "behind a tripod",
                                  "with a camera", "with arms crossed", "next to a car", "under an umbrella"],
     ["any"]),
    (V("walk/walks/walking"), ["a dog", "down the street", "across a field", "along a river", "past a brick wall",
                               "on a gravel path", "through the grass", "with a bicycle"], ["outdoor"]),
    (V("write/writes/writing"), ["on a sheet of paper", "notes with a pen", "math on a whiteboard",
                                 "a letter", "in a notebook", "numbers on paper"], ["indoor", "table"]),
    (V("pose/poses/posing"), ["for a photo", "for a portrait", "with a helmet", "for the camera",
                              "for an official photo", "with a motorcycle"], ["portrait", "any"]),
    (V("smile/smiles/smiling"), ["at the camera", "for a picture", "for a portrait", "at someone"],
     ["portrait", "any"]),
    (V("play/plays/playing"), ["with a cat", "with a dog", "a guitar", "frisbee", "soccer", "with a kite"],
     ["nature", "indoor"]),
    (V("push/pushes/pushing"), ["a bicycle", "a motorcycle", "a stroller", "a cart"], ["street"]),
    (V("fly/flies/flying"), ["a kite", "a small airplane"], ["nature"]),
    (V("feed/feeds/feeding"), ["a horse", "the birds", "a goat", "a sheep", "the ducks"], ["nature"]),
    (V("pet/pets/petting"), ["a cat", "a dog", "a horse", "a kitten"], ["any"]),
    (V("film/films/filming"), ["a rocket launch", "the crowd", "a street scene", "a bird", "the sunset"],
     ["outdoor"]),
    (V("watch/watches/watching"), ["a rocket launch", "the sunset", "the boats on the lake", "the stars",
                                   "the moon rise", "a horse race", "the traffic"], ["outdoor"]),
    (V("repair/repairs/repairing"), ["a motorcycle", "a bicycle", "a car", "an old engine"], ["street", "indoor"]),
    (V("read/reads/reading"), ["a book", "a newspaper", "a letter", "a menu", "a sheet of paper"],
     ["table", "indoor", "nature"]),
    (V("pick/picks/picking"), ["flowers", "some flowers", "an orange flower", "a rose"], ["nature"]),
    (V("carry/carries/carrying"), ["a helmet", "a box", "a tray of coffee", "a camera and tripod", "a bag",
                                   "a bunch of flowers"], ["any"]),
]

# animals: noun, adjectives, actions (verb, complements)
CAT_ADJ = ["tabby", "striped", "gray", "orange", "black", "white", "brown", "fluffy", "small", "sleepy",
           "curious", "young", "black and white", "brown striped", "tiny"]
DOG_ADJ = ["brown", "black", "white", "small", "large", "fluffy", "happy", "young", "spotted", "shaggy"]
HORSE_ADJ = ["brown", "white", "black", "tall", "young", "spotted", "dark brown", "beautiful"]
BIRD_ADJ = ["small", "black", "white", "colorful", "little", "gray", "yellow", "blue"]
EYE = ["green eyes", "yellow eyes", "blue eyes", "big green eyes", "bright yellow eyes", "wide eyes",
       "golden eyes", "amber eyes", "yellow green eyes"]

ANIMALS = {
    "cat": (CAT_ADJ, [
        (V("sit/sits/sitting"), ["on a couch", "on a windowsill", "on a wooden floor", "in the grass", "on a blanket",
                                 "next to a window", "on a chair", "on top of a table", "in a cardboard box",
                                 "on a brick wall"]),
        (V("lie/lies/lying"), ["on a bed", "on a blanket", "in the sun", "on the carpet", "on a pillow",
                               "on a couch", "next to a laptop"]),
        (V("sleep/sleeps/sleeping"), ["on a couch", "on a bed", "in a basket", "on a pillow", "in the sun"]),
        (V("look/looks/looking"), ["at the camera", "out of a window", "to the side", "up at something",
                                   "at a bird", "to the left", "to the right"]),
        (V("stare/stares/staring"), ["at the camera", "out the window", "at something", "into the distance"]),
        (V("play/plays/playing"), ["with a toy", "with a ball of yarn", "on the floor", "in the grass"]),
        (V("drink/drinks/drinking"), ["from a bowl", "water from a cup", "from a faucet"]),
        (V("walk/walks/walking"), ["across a table", "along a fence", "on the grass", "through a garden"]),
    ]),
    "kitten": (CAT_ADJ, None),
    "dog": (DOG_ADJ, [
        (V("run/runs/running"), ["across a field", "on the beach", "through the grass", "in a park"]),
        (V("sit/sits/sitting"), ["on a couch", "in the grass", "next to a bench", "in the back of a truck"]),
        (V("lie/lies/lying"), ["on the floor", "on a rug", "in the grass", "on a bed"]),
        (V("catch/catches/catching"), ["a frisbee", "a ball", "a stick"]),
        (V("play/plays/playing"), ["with a ball", "in the snow", "with a frisbee", "in the water"]),
        (V("look/looks/looking"), ["at the camera", "out of a car window", "up at its owner"]),
    ]),
    "puppy": (DOG_ADJ, None),
    "horse": (HORSE_ADJ, [
        (V("graze/grazes/grazing"), ["in a field", "in a green pasture", "on a hill", "near a fence"]),
        (V("stand/stands/standing"), ["in a field", "next to a fence", "in a stable", "in the grass"]),
        (V("run/runs/running"), ["across a field", "along a beach", "in a pasture"]),
        (V("pull/pulls/pulling"), ["a cart", "a carriage", "a wagon"]),
    ]),
    "bird": (BIRD_ADJ, [
        (V("sit/sits/sitting"), ["on a branch", "on a fence", "on a rock", "on a wire", "on a roof"]),
        (V("perch/perches/perching"), ["on a branch", "on a tree", "on a wooden post", "on a flower"]),
        (V("fly/flies/flying"), ["over the water", "across the sky", "over a field", "above the trees"]),
        (V("stand/stands/standing"), ["on the grass", "on a rock", "in shallow water", "on the sand"]),
    ]),
    "duck": (["white", "brown", "small", "wild"], [
        (V("swim/swims/swimming"), ["in a pond", "on a lake", "in the river", "near the shore"]),
        (V("walk/walks/walking"), ["on the grass", "along the shore", "across a path"]),
    ]),
    "cow": (["brown", "black and white", "large", "young"], [
        (V("graze/grazes/grazing"), ["in a field", "on a hillside", "in a green pasture"]),
        (V("stand/stands/standing"), ["in a field", "next to a barn", "in the grass"]),
    ]),
    "sheep": (["white", "fluffy", "young", "small"], [
        (V("graze/grazes/grazing"), ["in a field", "on a hill", "on green grass"]),
        (V("stand/stands/standing"), ["in a field", "near a fence", "on a hillside"]),
    ]),
}
ANIMALS["kitten"] = (CAT_ADJ, ANIMALS["cat"][1])
ANIMALS["puppy"] = (DOG_ADJ, ANIMALS["dog"][1])

VEHICLES: dict[str, tuple[list[str], list[tuple[str, bool]]]] = {
    # noun: (adjectives, [(predicate, may follow "is")])
    "motorcycle": (["red", "black", "blue", "old", "shiny", "vintage", "red and black", "small"], [
        ("parked in a garage", True), ("parked on a concrete floor", True), ("parked on the street", True),
        ("parked next to a wooden bench", True), ("parked in front of a shop", True),
        ("standing on its kickstand", True), ("standing in a driveway", True), ("leaning against a wall", True),
        ("with a black leather seat", False), ("with chrome pipes and wheels", False),
        ("driving down a country road", True), ("parked next to some boxes", True),
        ("parked beside a row of shelves", True), ("in a garage full of tools", False),
        ("parked in a parking lot", True), ("parked near other motorcycles", True),
    ]),
    "motorbike": (["red", "black", "old", "shiny", "small"], [
        ("parked in a garage", True), ("parked on the street", True), ("standing in a workshop", True),
        ("with a black seat", False), ("parked on a sidewalk", True),
    ]),
    "scooter": (["red", "blue", "white", "small", "old"], [
        ("parked on a sidewalk", True), ("parked next to a wall", True), ("driving down a narrow street", True),
    ]),
    "bicycle": (["red", "blue", "old", "black", "yellow", "green"], [
        ("leaning against a brick wall", True), ("parked next to a bench", True), ("locked to a pole", True),
        ("parked on a sidewalk", True), ("lying in the grass", True), ("with a basket on the front", False),
    ]),
    "car": (["red", "white", "black", "blue", "old", "small", "silver"], [
        ("parked on a street", True), ("driving down a highway", True), ("stopped at a traffic light", True),
        ("parked in front of a house", True), ("driving along a country road", True), ("parked in a garage", True),
    ]),
    "truck": (["large", "white", "red", "old", "blue"], [
        ("parked on the side of the road", True), ("driving down a highway", True), ("parked next to a building", True),
    ]),
    "bus": (["red", "yellow", "blue", "double decker", "city"], [
        ("driving down a city street", True), ("stopped at a bus stop", True), ("parked next to a sidewalk", True),
    ]),
    "train": (["long", "red", "old", "passenger", "freight"], [
        ("traveling down the tracks", True), ("stopped at a station", True), ("crossing a bridge", True),
        ("passing through the countryside", True),
    ]),
    "boat": (["small", "white", "wooden", "red", "fishing"], [
        ("floating on a lake", True), ("docked at a pier", True), ("sailing on calm water", True),
        ("tied to a dock", True), ("on the water near the shore", False), ("crossing a wide lake", True),
    ]),
    "airplane": (["large", "white", "small", "passenger"], [
        ("flying over the clouds", True), ("parked at an airport", True), ("taking off from a runway", True),
        ("flying through a blue sky", True), ("landing on a runway", True),
    ]),
    "helicopter": (["red", "white", "military", "small"], [
        ("flying over a city", True), ("landing on a helipad", True), ("hovering above a field", True),
    ]),
    "rocket": (["white", "tall", "large", "space", "huge"], [
        ("standing on a launch pad", True), ("lifting off into the sky", True), ("launching at night", True),
        ("on the launch pad at dusk", False), ("between tall metal towers", False), ("ready for launch", False),
        ("lit by bright lights", True), ("leaving a trail of smoke", True), ("sitting on a launch pad", True),
        ("on a launch pad at night", False), ("next to a tall steel tower", False),
        ("standing upright on the pad", True), ("waiting to launch at sunset", True),
        ("blasting off from a launch site", True), ("under a dark blue sky", False),
    ]),
}

BUILDINGS = ["building", "tower", "pagoda", "temple", "palace", "church", "castle", "house", "skyscraper",
             "lighthouse", "clock tower", "barn", "library", "museum"]
BUILDING_ADJ = ["tall", "old", "ancient", "red", "colorful", "ornate", "chinese", "traditional", "stone",
                "wooden", "large", "small", "white", "historic", "modern", "brick", "painted", "red and green"]
BUILDING_PRED = [
    "on top of a hill", "next to a lake", "surrounded by green trees", "overlooking a river",
    "under a clear blue sky", "with a tiled roof", "with many windows", "on a hazy day", "by the water",
    "in the middle of a city", "on a hillside", "rising above the trees", "with a curved roof",
    "near the edge of a lake", "behind a row of trees", "in a large park", "at the end of a street",
    "with several floors", "in the afternoon sun", "overlooking the water",
]

FLOWERS = ["flower", "rose", "sunflower", "dahlia", "tulip", "daisy", "lily"]
FLOWER_COLORS = ["orange", "red", "pink", "yellow", "white", "purple", "bright orange", "deep red", "pale pink"]

TABLEWARE_SURFACES = ["a wooden table", "a kitchen counter", "a white table", "a desk", "a tray", "a marble counter",
                      "a table", "a dark wooden table", "a cafe table", "a small table", "a wooden surface"]
DRINKS = ["coffee", "espresso", "tea", "hot chocolate", "black coffee", "milk", "cappuccino"]
CUP_ADJ = ["", "", "small", "white", "red", "blue", "large", "ceramic", "red and white", "tiny", "porcelain"]
FOODS = ["food", "pasta", "salad", "rice", "fruit", "cake", "pizza", "cookies", "bread", "vegetables",
         "eggs and toast", "pancakes"]


# --------------------------------------------------------------------------- sentence makers


def person_np(R: random.Random, number: str) -> tuple[str, str]:
    """A person noun phrase in the given number ('sg' | 'pl') and its pronoun."""
    noun, pron = R.choice(PEOPLE)
    if number == "sg":
        adj = R.choice(PERSON_ADJ)
        return art(f"{adj} {noun}".strip()), pron
    head = plural(noun)
    return f"{R.choice(NUMBERS)} {head}", "their"


def person_modifier(R: random.Random) -> str:
    r = R.random()
    if r < 0.35:
        return ""
    if r < 0.7:
        return " in " + R.choice([c for c in CLOTHES if c not in ("glasses", "sunglasses")])
    return " with " + R.choice(WITH_FEATURES)


def s_person(R: random.Random) -> str:
    verb, objs, kinds = R.choice(PERSON_ACTIONS)
    obj = R.choice(objs)
    place = R.choice(PLACES[R.choice(kinds)]) if R.random() < 0.75 else ""
    number = "sg" if R.random() < 0.75 else "pl"
    np, pron = person_np(R, number)
    mod = person_modifier(R) if number == "sg" and verb.base != "wear" else ""
    form = R.random()
    tail = f"{obj} {place}".strip()
    if form < 0.45:
        s = f"{np}{mod} {verb.ing} {tail}"
    elif form < 0.65:
        aux = "is" if number == "sg" else "are"
        s = f"{np}{mod} {aux} {verb.ing} {tail}"
    elif form < 0.85:
        v = verb.third if number == "sg" else verb.base
        s = f"{np}{mod} {v} {tail}"
    else:
        lead = R.choice(["there is", "a photo of", "a picture of", "an image of", "a black and white photo of"])
        if lead == "there is" and number == "pl":
            lead = "there are"
        s = f"{lead} {np}{mod} {verb.ing} {tail}"
    return s


def s_portrait(R: random.Random) -> str:
    noun, pron = R.choice(PEOPLE[:18] + [("astronaut", "their"), ("officer", "their"), ("pilot", "their")])
    age = R.choice(["", "", "smiling", "older", "young", "elderly", "serious"])
    if age in AGE_WORDS and (" " in noun or noun in KIDS):
        age = ""
    who = art(f"{age} {noun}".strip())
    c1, c2 = R.sample(CLOTHES, 2)
    place = R.choice(PLACES["portrait"])
    r = R.random()
    if r < 0.2:
        return f"a portrait of {who} wearing {c1} and {c2}"
    if r < 0.35:
        return f"a portrait of {who} in {c1} {place}"
    if r < 0.5:
        return f"{who} wearing {c1} posing {place}"
    if r < 0.6:
        return f"{who} with {R.choice(WITH_FEATURES)} wearing {c1}"
    if r < 0.7:
        return f"an official portrait of {who} in {c1}"
    if r < 0.8:
        return f"{who} in {c1} smiling {place}"
    if r < 0.9:
        chest = "the" if pron == "their" else pron
        if noun in KIDS:
            return f"{who} in {c1} {place}"
        return f"{who} in {R.choice(['a navy uniform', 'a military uniform', 'a dark uniform'])} with medals on {chest} chest"
    return f"a close up of the face of {who} wearing {c1}"


def s_space_person(R: random.Random) -> str:
    who = art(R.choice(["astronaut", "smiling astronaut", "female astronaut", "male astronaut", "woman astronaut",
                        "young astronaut", "astronaut with short hair"]))
    suit = R.choice(["an orange space suit", "a white space suit", "an orange flight suit", "a space suit",
                     "a blue flight suit"])
    x = R.choice(["a helmet", "a white helmet", "a black helmet", "a flag", "an american flag", "a model rocket",
                  "a space shuttle model", "a large window"])
    r = R.random()
    if r < 0.25:
        return f"{who} in {suit} standing next to {x}"
    if r < 0.45:
        return f"{who} wearing {suit} and holding {x}"
    if r < 0.6:
        return f"a portrait of {who} in {suit} with {x}"
    if r < 0.75:
        return f"{who} in {suit} posing {R.choice(PLACES['portrait'])}"
    if r < 0.9:
        return f"{who} puts on {x} before a flight"
    return f"{who} waves from the door of a space shuttle"


def s_animal(R: random.Random) -> str:
    name = R.choice(["cat", "cat", "cat", "kitten", "dog", "dog", "puppy", "horse", "horse", "bird", "duck", "cow", "sheep"])
    adjs, actions = ANIMALS[name]
    verb, comps = R.choice(actions)
    comp = R.choice(comps)
    number = "sg" if R.random() < 0.8 else "pl"
    adj = R.choice(adjs + [""])
    if number == "sg":
        np = art(f"{adj} {name}".strip())
    else:
        np = f"{R.choice(NUMBERS)} {adj + ' ' if adj else ''}{plural(name)}"
    r = R.random()
    if r < 0.5:
        return f"{np} {verb.ing} {comp}"
    if r < 0.7:
        return f"{np} {'is' if number == 'sg' else 'are'} {verb.ing} {comp}"
    if r < 0.9:
        return f"{np} {verb.third if number == 'sg' else verb.base} {comp}"
    lead = "there is" if number == "sg" else "there are"
    return f"{lead} {np} {verb.ing} {comp}"


def s_cat_face(R: random.Random) -> str:
    name = R.choice(["cat", "cat", "kitten", "tabby cat", "house cat"])
    adj = R.choice(CAT_ADJ + [""])
    cat = art(f"{adj} {name}".strip())
    eye = R.choice(EYE)
    r = R.random()
    if r < 0.2:
        return f"a close up of {cat} with {eye}"
    if r < 0.35:
        return f"the face of {cat} with {eye} and long whiskers"
    if r < 0.5:
        return f"{cat} with {eye} looking {R.choice(['to the side', 'at the camera', 'up', 'to the left', 'to the right'])}"
    if r < 0.6:
        return f"a close view of the face of {cat}"
    if r < 0.7:
        return f"{cat} with {R.choice(['pointed', 'large', 'small'])} ears and {eye}"
    if r < 0.8:
        return f"a picture of {cat} staring with {eye}"
    if r < 0.9:
        return f"the head of {cat} in front of a {R.choice(['gray', 'white', 'dark', 'blurry', 'brown'])} wall"
    return f"{cat} with {eye} and a pink nose"


def s_vehicle(R: random.Random) -> str:
    name = R.choice(["motorcycle"] * 5 + ["motorbike", "scooter", "bicycle", "bicycle", "car", "car", "truck", "bus",
                                          "train", "boat", "boat", "airplane", "helicopter"] + ["rocket"] * 5)
    adjs, preds = VEHICLES[name]
    pred, can_is = R.choice(preds)
    adj = R.choice(adjs + [""])
    number = "sg" if R.random() < 0.85 else "pl"
    if number == "sg":
        np = art(f"{adj} {name}".strip())
    else:
        np = f"{R.choice(NUMBERS)} {adj + ' ' if adj else ''}{plural(name)}"
        pred = pred.replace(" its kickstand", " their kickstands").replace(" its ", " their ")
    r = R.random()
    if r < 0.55 or not can_is:
        lead = R.choice(["", "", "", "a photo of ", "a view of ", "a black and white photo of "])
        return f"{lead}{np} {pred}"
    if r < 0.8:
        return f"{np} {'is' if number == 'sg' else 'are'} {pred}"
    return f"{'there is' if number == 'sg' else 'there are'} {np} {pred}"


def s_motorcycle_detail(R: random.Random) -> str:
    c = R.choice(["red", "black", "blue", "red and black", "shiny red", "old", "classic"])
    m = R.choice(["motorcycle", "motorcycle", "motorbike"])
    things = ["a wooden bench", "shelves full of boxes", "a workbench", "a stack of boxes", "a metal shelf",
              "a toolbox", "an old bicycle", "a garage door", "some cardboard boxes", "a storage rack"]
    a, b = R.sample(things, 2)
    r = R.random()
    if r < 0.3:
        return f"{art(c + ' ' + m)} parked in a garage next to {a}"
    if r < 0.5:
        return f"{art(c + ' ' + m)} stands in a garage with {a} and {b}"
    if r < 0.7:
        return f"a garage with {art(c + ' ' + m)} and {a}"
    if r < 0.85:
        return f"the side view of {art(c + ' ' + m)} with a {R.choice(['black', 'brown', 'leather'])} seat"
    return f"{art(c + ' ' + m)} on a concrete floor in front of {a}"


def s_rocket_detail(R: random.Random) -> str:
    r = R.random()
    rocket = art(R.choice(["white rocket", "tall rocket", "rocket", "space rocket", "large rocket", "rocket",
                           "white missile", "missile"]))
    time = R.choice(["at dusk", "at night", "at sunset", "in the evening", "before dawn", "under a cloudy sky"])
    if r < 0.25:
        return f"{rocket} on a launch pad {time}"
    if r < 0.45:
        return f"{rocket} stands between {R.choice(['two', 'four', 'several'])} metal towers {time}"
    if r < 0.6:
        return f"bright lights shine on {rocket} {time}"
    if r < 0.75:
        return f"a launch pad with {rocket} and tall steel towers {time}"
    if r < 0.9:
        return f"a crowd watching {rocket} launch into the {R.choice(['sky', 'clouds', 'blue sky', 'night sky'])}"
    return f"smoke and fire under {rocket} as it lifts off"


def s_camera(R: random.Random) -> str:
    who = art(R.choice(["man", "photographer", "young man", "woman", "cameraman", "man with dark hair",
                        "person", "tourist"]))
    coat = R.choice(["", " in a dark coat", " in a long coat", " in a black coat", " in a jacket", " wearing gloves"])
    cam = R.choice(["a camera on a tripod", "a video camera", "a camera", "an old camera", "a camera and tripod",
                    "a movie camera on a tripod"])
    place = R.choice(["in a grassy field", "in a park", "on a lawn", "in an open field", "on a college campus",
                      "near some buildings", "on a sunny day", "by the road", "on a field"])
    r = R.random()
    if r < 0.3:
        return f"{who}{coat} {R.choice(['using', 'looking through', 'adjusting', 'setting up'])} {cam} {place}"
    if r < 0.5:
        return f"a black and white photo of {who}{coat} with {cam}"
    if r < 0.65:
        return f"{who}{coat} takes a picture with {cam} {place}"
    if r < 0.8:
        return f"{art('tripod')} with a camera standing {place}"
    if r < 0.9:
        return f"{who}{coat} bending over {cam}"
    return f"a camera on a tripod pointed at {R.choice(['the buildings', 'a field', 'the sky', 'a river'])}"


def s_table(R: random.Random) -> str:
    drink = R.choice(DRINKS)
    cup_adj = R.choice(CUP_ADJ)
    cup = R.choice(["cup", "cup", "mug", "coffee cup", "glass"]) if drink != "espresso" else R.choice(["cup", "espresso cup"])
    cupnp = art(f"{cup_adj} {cup}".strip())
    surf = R.choice(TABLEWARE_SURFACES)
    extra = R.choice(["a spoon", "a small spoon", "a silver spoon", "a saucer", "a plate of cookies", "a newspaper",
                      "a laptop", "a book", "a glass of water", "a piece of cake", "a sugar bowl", "a napkin"])
    saucer = R.choice(["a saucer", "a matching saucer", art(f"{R.choice(COLORS)} saucer"), "a white plate"])
    r = R.random()
    if r < 0.18:
        return f"{cupnp} of {drink} on {saucer} on {surf}"
    if r < 0.32:
        return f"{cupnp} of {drink} next to {extra} on {surf}"
    if r < 0.44:
        return f"{cupnp} of {drink} sitting on {surf}"
    if r < 0.54:
        return f"a spoon resting on {saucer} beside {cupnp} of {drink}"
    if r < 0.64:
        return f"a close up of {cupnp} filled with {drink}"
    if r < 0.74:
        n = R.choice(["two", "three", "a few"])
        return f"{n} cups of {drink} on {surf} in a cafe"
    if r < 0.84:
        food = R.choice(FOODS)
        return f"a plate of {food} and {cupnp} of {drink} on {surf}"
    if r < 0.92:
        return f"{art(R.choice(['plate', 'bowl', 'white plate', 'large bowl']))} of {R.choice(FOODS)} on {surf}"
    return f"someone stirring {cupnp} of {drink} with a spoon"


def s_building(R: random.Random) -> str:
    b = R.choice(BUILDINGS + ["pagoda", "tower", "temple", "palace"])
    adj = R.choice(BUILDING_ADJ + [""])
    np = art(f"{adj} {b}".strip())
    p1, p2 = R.sample(BUILDING_PRED, 2)
    r = R.random()
    if r < 0.3:
        return f"{np} {p1}"
    if r < 0.45:
        return f"{np} {p1} {p2}" if len((np + p1 + p2).split()) <= 16 else f"{np} {p2}"
    if r < 0.6:
        return f"a view of {np} {p1}"
    if r < 0.7:
        return f"{np} and some trees {p1}"
    if r < 0.8:
        return f"the roof of {np} {p1}"
    if r < 0.9:
        return f"{np} stands {p1}"
    return f"tourists walking toward {np} {p1}"


def s_landscape(R: random.Random) -> str:
    r = R.random()
    water = R.choice(["a lake", "a river", "the sea", "a calm lake", "a wide river", "a pond"])
    if r < 0.15:
        return f"{art(R.choice(['tall', 'green', 'large', 'old', 'leafy']) + ' tree')} next to {water}"
    if r < 0.3:
        return f"a row of trees along {R.choice(['a road', 'a river', 'a field', 'the shore'])}"
    if r < 0.45:
        return f"a view of {water} from the top of a hill"
    if r < 0.55:
        return f"boats on {water} surrounded by {R.choice(['trees', 'hills', 'mountains', 'buildings'])}"
    if r < 0.7:
        return f"green trees and {water} under a {R.choice(['hazy', 'clear', 'blue', 'cloudy'])} sky"
    if r < 0.8:
        return f"a small island in the middle of {water}"
    if r < 0.9:
        return f"a city skyline behind {water} on a {R.choice(['sunny', 'hazy', 'cloudy'])} day"
    return f"mountains and trees reflected in {water}"


def s_flower(R: random.Random) -> str:
    f = R.choice(FLOWERS + ["flower", "flower"])
    c = R.choice(FLOWER_COLORS)
    r = R.random()
    if r < 0.15:
        return f"a close up of {art(c + ' ' + f)} with {R.choice(['many', 'soft', 'bright', 'curled', 'round'])} petals"
    if r < 0.3:
        return f"{art(c + ' ' + f)} growing in a garden {R.choice(['next to green leaves', 'in the sun', 'after the rain', ''])}".strip()
    if r < 0.42:
        return f"a bunch of {c} {plural(f)} in {art(R.choice(COLORS) + ' vase')}"
    if r < 0.52:
        return f"a field of {c} {plural(f)} under a blue sky"
    if r < 0.62:
        return f"a bee sitting on {art(c + ' ' + f)}"
    if r < 0.72:
        return f"{art(c + ' ' + f)} in bloom surrounded by dark green leaves"
    if r < 0.82:
        return f"{R.choice(['two', 'three', 'several'])} {c} {plural(f)} in a flower bed"
    if r < 0.92:
        return f"{art(c + ' ' + f)} against a {R.choice(['blurry', 'dark', 'green', 'black'])} background"
    return f"a woman smelling {art(c + ' ' + f)} in a garden"


def s_sky(R: random.Random) -> str:
    r = R.random()
    if r < 0.2:
        moon = R.choice(["the rocky surface of the moon", "the gray surface of the moon", "the lunar surface",
                         "the surface of the moon", "a dusty plain on the moon"])
        return f"{moon} with {R.choice(['small', 'large', 'deep', 'round', 'many'])} craters and {R.choice(['dark spots', 'long shadows', 'rocks', 'hills'])}"
    r = R.random()
    if r < 0.12:
        return f"the {R.choice(['full', 'bright', 'white', 'pale'])} moon in a dark night sky"
    if r < 0.24:
        return f"a close up of the moon with {R.choice(['many', 'deep', 'small', 'round'])} craters"
    if r < 0.34:
        return f"the surface of the moon covered in {R.choice(['craters', 'dust and rocks', 'gray dust'])}"
    if r < 0.44:
        return f"a night sky filled with {R.choice(['bright stars', 'thousands of stars', 'stars and clouds'])}"
    if r < 0.54:
        return f"a telescope view of {R.choice(['distant galaxies', 'a spiral galaxy', 'a bright nebula', 'many stars'])}"
    if r < 0.58:
        return f"{R.choice(['hundreds of', 'countless', 'many'])} {R.choice(['tiny', 'distant', 'colorful', 'bright'])} galaxies scattered across {R.choice(['the universe', 'deep space', 'a black background'])}"
    if r < 0.62:
        return f"the moon rising over {R.choice(['the mountains', 'a city', 'the sea', 'a forest'])}"
    if r < 0.7:
        return f"a crescent moon above {R.choice(['a city skyline', 'a row of trees', 'a lake', 'the rooftops'])}"
    if r < 0.78:
        return f"colorful galaxies and stars in {R.choice(['deep space', 'the dark sky', 'outer space'])}"
    if r < 0.86:
        return f"a gray picture of the moon showing {R.choice(['craters', 'mountains', 'shadows', 'dark plains'])}"
    if r < 0.93:
        return f"a bright star shining in {R.choice(['the night sky', 'a dark sky', 'the sky above a field'])}"
    return f"people looking at the {R.choice(['moon', 'stars', 'night sky'])} through a telescope"


def s_ground(R: random.Random) -> str:
    r = R.random()
    if r < 0.12:
        return f"a pile of {R.choice(['gray', 'small', 'round', 'white', 'smooth'])} stones next to {R.choice(['a road', 'a path', 'a wall', 'a river'])}"
    if r < 0.22:
        return f"a gravel road leading through {R.choice(['a field', 'a forest', 'a park', 'the countryside'])}"
    if r < 0.34:
        return f"a patch of {R.choice(['green', 'dry', 'tall', 'short', 'wet'])} grass in {R.choice(['a park', 'a yard', 'a field', 'the sun'])}"
    if r < 0.46:
        return f"{art(R.choice(['red', 'old', 'gray', 'brown', 'long', 'tall']) + ' brick wall')} next to {R.choice(['a sidewalk', 'a street', 'a garden', 'a door'])}"
    if r < 0.56:
        return f"a close up of {art(R.choice(['old', 'red', 'gray', 'worn', 'clean']) + ' brick wall')}"
    if r < 0.66:
        return f"a path covered in {R.choice(['small stones', 'gravel', 'pebbles', 'dry leaves'])} through a garden"
    if r < 0.74:
        return f"a lawn of {R.choice(['short', 'green', 'thick'])} grass in front of a house"
    if r < 0.8:
        return f"the ground covered with {R.choice(['small stones', 'gravel', 'dry grass', 'fallen leaves', 'rocks'])}"
    if r < 0.84:
        return f"a {R.choice(['cat', 'dog', 'bird', 'child'])} sitting on {R.choice(['a gravel path', 'the ground'])}"
    if r < 0.9:
        return f"{R.choice(['a horse', 'a sheep', 'a cow'])} eating grass in a field"
    return f"a building made of {R.choice(['red', 'old', 'gray', 'brown'])} bricks with {R.choice(['white windows', 'a wooden door', 'a flat roof'])}"


def s_paper(R: random.Random) -> str:
    r = R.random()
    if r < 0.06:
        return f"an old coin with {R.choice(['a face', 'a horse', 'an eagle', 'a figure'])} stamped on it"
    if r < 0.12:
        return f"a sheet of paper with {R.choice(['handwritten notes', 'math equations', 'a drawing', 'numbers', 'handwriting'])} on it"
    if r < 0.22:
        return f"a page of {R.choice(['math equations', 'formulas', 'notes'])} written in {R.choice(['pencil', 'black ink', 'blue ink'])}"
    if r < 0.34:
        return f"{art(R.choice(['person', 'student', 'man', 'woman', 'girl']))} writing on a sheet of paper with a pen"
    if r < 0.44:
        return f"a notebook filled with {R.choice(['handwriting', 'math', 'drawings', 'neat notes'])}"
    if r < 0.54:
        return f"a pile of {R.choice(['old', 'gold', 'silver', 'copper'])} coins on a table"
    if r < 0.64:
        return f"a close up of {art(R.choice(['silver', 'gold', 'old', 'ancient']) + ' coin')} with a face on it"
    if r < 0.72:
        return f"a collection of {R.choice(['ancient', 'old', 'roman', 'rare'])} coins in a museum case"
    if r < 0.8:
        return f"a hand holding {art(R.choice(['gold', 'silver', 'small', 'shiny']) + ' coin')}"
    if r < 0.88:
        return "a pen lying on a sheet of paper with writing"
    if r < 0.94:
        return f"a blackboard covered with {R.choice(['math', 'chalk writing', 'numbers and symbols'])}"
    if r < 0.97:
        return f"a jar full of {R.choice(['coins', 'old coins', 'pennies'])} on a shelf"
    return f"{R.choice(['neat', 'messy', 'small', 'slanted'])} handwriting on a page of {R.choice(['lined', 'white', 'old'])} paper"


def s_flag(R: random.Random) -> str:
    r = R.random()
    flag = R.choice(["an american flag", "a flag", "a large flag", "a red white and blue flag"])
    if r < 0.3:
        return f"{flag} waving {R.choice(['in the wind', 'on a pole', 'above a building', 'over a crowd'])}"
    if r < 0.55:
        return f"{art(R.choice(['man', 'woman', 'soldier', 'officer']))} in uniform standing next to {flag}"
    if r < 0.75:
        return f"{flag} hanging {R.choice(['on a wall', 'behind a desk', 'in an office', 'next to a window'])}"
    return f"a group of people holding {flag} at a parade"


TABLE_ITEMS = ["book", "bottle", "bowl", "candle", "clock", "keyboard", "laptop", "lamp", "mug", "phone", "plate",
               "vase", "glass", "knife", "fork", "teapot", "kettle", "toaster", "pen", "pair of scissors", "box",
               "bag", "watch", "camera", "apple", "banana", "orange", "lemon", "tomato", "loaf of bread", "cake",
               "cookie", "doughnut", "muffin", "pizza", "sandwich", "pineapple", "mushroom", "carrot", "helmet",
               "hat", "pair of glasses", "coin", "spoon", "cup", "candy bar", "pumpkin", "towel", "remote control"]
ITEM_PLACES = ["on a wooden table", "on a kitchen counter", "on a desk", "on a shelf", "on a white plate",
               "next to a window", "on a tray", "in a basket", "on the floor", "on a bed", "on a windowsill",
               "on the ground", "on the grassy ground"]
WILDLIFE = {
    "elephant": ["walking through the grass", "standing near a river", "drinking from a pond", "in a zoo"],
    "giraffe": ["eating leaves from a tree", "standing in a field", "walking across the grass"],
    "zebra": ["grazing in a field", "standing in the grass", "walking near some trees"],
    "lion": ["lying in the grass", "resting under a tree", "walking on a rock"],
    "tiger": ["walking through the grass", "lying in the shade", "resting near the water"],
    "bear": ["standing in a river", "walking through the woods", "sitting on a rock"],
    "monkey": ["sitting in a tree", "eating a banana", "hanging from a branch"],
    "goat": ["standing on a rock", "eating grass", "grazing on a hillside"],
    "deer": ["standing in a forest", "grazing in a meadow", "running across a field"],
    "rabbit": ["sitting in the grass", "eating a carrot", "hiding under a bush"],
    "squirrel": ["sitting on a branch", "eating a nut", "running across the lawn"],
    "owl": ["sitting on a branch", "perched in a tree", "looking at the camera"],
    "parrot": ["sitting on a perch", "perched on a branch", "eating a seed"],
    "butterfly": ["sitting on a flower", "resting on a leaf", "flying over the flowers"],
    "turtle": ["swimming in the water", "resting on a rock", "crawling on the sand"],
    "swan": ["swimming on a lake", "floating on a pond"],
    "penguin": ["standing on the ice", "walking along the shore"],
}


def s_objects(R: random.Random) -> str:
    a, b = R.sample(TABLE_ITEMS, 2)
    place = R.choice(ITEM_PLACES)
    r = R.random()
    if r < 0.35:
        return f"{art(a)} and {art(b)} {place}"
    if r < 0.55:
        return f"{art(R.choice(COLORS) + ' ' + a)} sitting {place}"
    if r < 0.7:
        return f"{art(a)} next to {art(b)} {place}"
    if r < 0.85:
        return f"a close up of {art(a)} {place}"
    return f"{R.choice(['two', 'three', 'several'])} {plural(a)} lying {place}"


def s_wildlife(R: random.Random) -> str:
    name = R.choice(list(WILDLIFE))
    what = R.choice(WILDLIFE[name])
    adj = R.choice(["", "", "large", "small", "young", "wild", "baby"])
    r = R.random()
    if r < 0.6:
        return f"{art((adj + ' ' + name).strip())} {what} on a sunny day" if R.random() < 0.2 else f"{art((adj + ' ' + name).strip())} {what}"
    if r < 0.8:
        return f"{R.choice(['two', 'three', 'a group of', 'several'])} {plural(name)} {what}"
    return f"a photo of {art(name)} {what}"


def s_face(R: random.Random) -> str:
    noun, pron = R.choice(PEOPLE[:18])
    who = art(noun)
    feat = R.choice(["glasses", "a beard", "short hair", "a wide smile", "blue eyes", "gray hair", "a hat",
                     "freckles", "curly hair", "dark eyes"])
    r = R.random()
    if r < 0.3:
        return f"a close up of the face of {who} with {feat}"
    if r < 0.55:
        return f"the face of {who} looking {R.choice(['at the camera', 'to the side', 'up at the sky', 'down'])}"
    if r < 0.75:
        return f"{who} with {feat} smiling at the camera"
    return f"a picture of the smiling face of {who} with {feat}"


def pick(r: float, branches: list[tuple[float, Callable[[], str]]]) -> str:
    """The sentence of the first of ``branches`` [(upper bound, make), ...] whose bound exceeds ``r`` (a draw
    of R.random(); the last branch otherwise): only the chosen branch draws further."""
    return next((make for bound, make in branches if r < bound), branches[-1][1])()


FISH = {
    # name: (adjectives, where it is seen)
    "fish": (["red", "orange", "yellow", "blue", "striped", "tropical", "small", "colorful", "bright red", "silver"],
             ["aquarium", "reef", "black", "sea"]),
    "goldfish": (["orange", "small", "fancy", "orange and white", "little", "round"], ["aquarium", "bowl", "black"]),
    "betta fish": (["red", "blue", "orange", "purple", "red and blue"], ["aquarium", "black", "bowl"]),
    "angelfish": (["blue", "striped", "blue and yellow", "tropical"], ["reef", "aquarium", "sea"]),
    "tang": (["yellow", "blue", "bright yellow", "small"], ["reef", "aquarium"]),
    "clownfish": (["orange", "small", "striped"], ["reef", "aquarium"]),
    "rockfish": (["red", "orange", "large"], ["aquarium", "sea"]),
    "shark": (["small", "gray", "large"], ["aquarium", "sea"]),
}
FISH_PLACES = {
    "aquarium": ["in an aquarium", "in a large fish tank", "in a dark aquarium", "past the glass of an aquarium",
                 "in a tank with rocks and plants", "between rocks in an aquarium", "near the bottom of a tank"],
    "reef": ["over a coral reef", "near the coral", "above the sandy sea floor", "between rocks and coral",
             "in shallow clear water", "over white sand"],
    "black": ["against a black background", "on a dark background", "in front of a black wall",
              "in dark water"],
    "sea": ["in the open sea", "in deep blue water", "near the surface of the sea", "in the ocean"],
    "bowl": ["in a glass bowl", "in a round fish bowl", "in a small bowl of water"],
}
FISH_VERBS = ["swimming", "floating", "gliding", "turning", "resting", "drifting"]
FISH_PARTS = ["long flowing fins", "a forked tail", "big round eyes", "thin stripes", "a white belly",
              "feathery fins", "a wide tail", "shiny scales", "spots on its side"]


def s_fish(R: random.Random) -> str:
    name = R.choice(list(FISH))
    adjs, kinds = FISH[name]
    place = R.choice(FISH_PLACES[R.choice(kinds)])
    fish = art(f"{R.choice(adjs + [''])} {name}".strip())
    def verb() -> str:
        return R.choice(FISH_VERBS)

    return pick(R.random(), [
        (0.3, lambda: f"{fish} {verb()} {place}"),
        (0.45, lambda: f"{fish} with {R.choice(FISH_PARTS)} {verb()} {place}"),
        (0.55, lambda: f"a close up of {fish} {place}"),
        (0.65, lambda: f"{R.choice(['two', 'three', 'several', 'a school of', 'many'])} {R.choice(adjs)} "
                       f"{plural(name)} {verb()} {place}"),
        (0.73, lambda: f"a child watching {fish} {place}"),
        (0.8, lambda: f"{fish} spreading its fins {place}"),
        (0.86, lambda: f"a photo of {fish} {place}"),
        (0.93, lambda: f"{fish} is {verb()} {place}"),
        (1.0, lambda: f"{fish} and a sea turtle swimming {R.choice(FISH_PLACES['sea'])}"),
    ])


def s_sea_life(R: random.Random) -> str:
    def jelly() -> str:
        one = art(R.choice(["pink", "purple", "translucent", "glowing", "large", "orange", "white"]) + " jellyfish")
        tail = R.choice(["with long tentacles", "trailing its tentacles", "with frilly arms", "", "with a round bell"])
        return f"{one} {R.choice(['drifting', 'floating', 'swimming', 'pulsing'])} {water} {tail}".strip()

    def turtle() -> str:
        one = art(R.choice(["sea", "green sea", "large sea", "young sea", "big"]) + " turtle")
        what = R.choice(["swimming", "gliding", "paddling", "diving"])
        extra = R.choice(["", " with a brown shell", " with a patterned shell", " with large flippers"])
        return f"{one}{extra} {what} {water}"

    r = R.random()
    water = R.choice(["in blue water", "in the deep blue sea", "in the ocean", "underwater", "in clear water",
                      "in an aquarium", "near the surface"])
    return pick(r, [
        (0.3, jelly),
        (0.38, lambda: f"{R.choice(['several', 'many', 'a group of', 'three'])} jellyfish floating {water}"),
        (0.65, turtle),
        (0.72, lambda: "a turtle resting on the sand with its shell covered in "
                       f"{R.choice(['algae', 'sand', 'small shells'])}"),
        (0.8, lambda: f"a diver swimming next to {R.choice(['a sea turtle', 'a jellyfish', 'a school of fish', 'a shark'])}"),
        (0.88, lambda: f"a starfish and some shells on the {R.choice(['sand', 'beach', 'sea floor'])}"),
        (1.0, lambda: f"coral and {R.choice(['small fish', 'a turtle', 'a jellyfish'])} {water}"),
    ])


GADGETS = {
    # noun phrase: (adjectives, details)
    "game controller": (["black", "white", "green", "wireless", "bright green", "blue", "red"],
                        ["with buttons and a joystick", "with two thumbsticks", "lit from above",
                         "with colored buttons"]),
    "video game controller": (["black", "gray", "green", "new"], ["with buttons", "with a thumbstick"]),
    "laptop": (["open", "silver", "black", "thin", "old", "new"],
               ["with a colorful screen", "with its screen glowing", "with a black keyboard",
                "with a bright screen", "with the lid half open"]),
    "keyboard": (["black", "white", "wireless", "mechanical"], ["with white keys", "with glowing keys"]),
    "rotary phone": (["black", "old", "vintage", "antique", "red", "black and silver"],
                     ["with a round dial", "with a curly cord", "with a silver handset"]),
    "telephone": (["old", "black", "white", "antique", "retro"], ["with a dial", "with a long cord"]),
    "sound mixer": (["large", "black", "digital"], ["with many sliders", "with colorful buttons",
                                                    "with silver faders and knobs"]),
    "audio mixer": (["large", "black", "digital"], ["with glowing buttons", "with rows of sliders"]),
    "electric guitar": (["blue", "red", "black", "white", "pale blue", "old"],
                        ["with six strings", "with a white pickguard", "with a long neck"]),
    "amplifier": (["black", "small", "old", "large"], ["with knobs on top", "with a speaker"]),
    "microphone": (["silver", "black", "old"], ["on a stand", "on a tall stand"]),
    "camera": (["black", "digital", "old", "small", "film"], ["with a large lens", "with a strap"]),
}
GADGET_VERBS = {"game controller": "holding", "video game controller": "holding", "laptop": "typing on",
                "keyboard": "typing on", "rotary phone": "talking on", "telephone": "talking on",
                "sound mixer": "adjusting", "audio mixer": "adjusting", "electric guitar": "playing",
                "amplifier": "turning on", "microphone": "singing into", "camera": "holding"}
GADGET_PLACES = ["on a wooden table", "on a desk", "in a dark room", "on a black background", "on a shelf",
                 "next to a window", "on a stage", "in a studio", "on the floor", "against a blue wall",
                 "on a small table", "in a music store", "on a couch", "next to a lamp"]


def s_gadget(R: random.Random) -> str:
    name = R.choice(list(GADGETS))
    adjs, details = GADGETS[name]
    thing = art(f"{R.choice(adjs)} {name}")
    place = R.choice(GADGET_PLACES)
    return pick(R.random(), [
        (0.3, lambda: f"{thing} {R.choice(details)} {place}"),
        (0.45, lambda: f"{thing} sitting {place}"),
        (0.55, lambda: f"a close up of {thing} {R.choice(details)}"),
        (0.65, lambda: f"{thing} next to {art(R.choice([n for n in GADGETS if n != name]))} {place}"),
        (0.75, lambda: f"{art(R.choice(['man', 'woman', 'boy', 'girl', 'teenager', 'musician', 'person']))} "
                       f"{GADGET_VERBS[name]} {thing} {place}"),
        (0.85, lambda: f"{thing} lit by a {R.choice(['soft', 'bright', 'blue', 'warm', 'single'])} light in the dark"),
        (0.93, lambda: f"a black and white photo of {thing} {place}"),
        (1.0, lambda: f"{thing} and a cup of coffee {place}"),
    ])


def s_stage(R: random.Random) -> str:
    guitar = art(R.choice(["electric guitar", "blue guitar", "red guitar", "acoustic guitar", "black guitar",
                           "bass guitar"]))
    return pick(R.random(), [
        (0.3, lambda: f"{guitar} leaning against "
                      f"{art(R.choice(['amplifier', 'black amplifier', 'old amp', 'speaker']))} on a stage"),
        (0.5, lambda: f"a stage with {guitar} and a microphone stand under "
                      f"{R.choice(['red', 'blue', 'bright', 'white'])} lights"),
        (0.7, lambda: f"{art(R.choice(['man', 'woman', 'musician', 'young man', 'singer']))} playing {guitar} "
                      f"on a {R.choice(['dark', 'small', 'lit', 'large'])} stage"),
        (0.85, lambda: f"a band playing music on a stage with {R.choice(['bright', 'colored', 'blue', 'red'])} lights"),
        (1.0, lambda: f"{guitar} resting on a stand next to a microphone"),
    ])


MOUNTAIN_SKY = ["under a blue sky", "under a hazy sky", "at sunset", "at sunrise", "at dusk", "under a cloudy sky",
                "in the morning light", "on a clear day", "in the evening light", "under dark clouds"]


def s_mountain(R: random.Random) -> str:
    peak = art(R.choice(["mountain", "mountain peak", "rocky mountain", "snowy mountain", "tall mountain",
                         "mountain range"]))
    return pick(R.random(), [
        (0.2, lambda: f"{peak} {R.choice(MOUNTAIN_SKY)} with "
                      f"{R.choice(['pine trees', 'a green valley', 'a lake', 'a field of grass', 'dry brush'])} below"),
        (0.35, lambda: f"snow covered mountains {R.choice(MOUNTAIN_SKY)}"),
        (0.45, lambda: f"the top of {peak} glowing {R.choice(['orange', 'pink', 'red', 'gold'])} "
                       f"{R.choice(['at sunset', 'at dawn', 'at dusk'])}"),
        (0.55, lambda: f"a field of {R.choice(['snow', 'yellow grass', 'dry brush', 'wild flowers'])} in front of {peak}"),
        (0.65, lambda: f"a hiker walking in the snow below {peak}"),
        (0.75, lambda: f"pine trees in front of {peak} {R.choice(MOUNTAIN_SKY)}"),
        (0.85, lambda: f"the sun shining over {peak} covered in snow"),
        (0.93, lambda: f"a wide valley between {R.choice(['two', 'tall', 'rocky', 'snowy'])} mountains "
                       f"{R.choice(MOUNTAIN_SKY)}"),
        (1.0, lambda: f"{art(R.choice(['skier', 'man', 'woman', 'climber']))} standing on a snowy mountain ridge"),
    ])


def s_outdoors(R: random.Random) -> str:
    return pick(R.random(), [
        (0.12, lambda: "the sun rising over "
                       f"{R.choice(['a misty meadow', 'a grassy hill', 'a field of grass', 'the trees', 'the sea'])}"),
        (0.22, lambda: f"{R.choice(['dark', 'gray', 'heavy', 'huge'])} storm clouds over "
                       f"{R.choice(['a green field', 'a wide plain', 'the prairie', 'a farm', 'the sea'])}"),
        (0.3, lambda: f"a {R.choice(['green', 'grassy', 'wide', 'flat'])} field under a "
                      f"{R.choice(['cloudy', 'stormy', 'blue', 'gray'])} sky"),
        (0.42, lambda: "a night sky full of stars over "
                       f"{R.choice(['a lake', 'the mountains', 'a forest', 'a tent', 'the sea', 'a field'])}"),
        (0.5, lambda: f"the milky way above {R.choice(['a dark forest', 'a still lake', 'the mountains', 'a desert'])}"),
        (0.6, lambda: f"{art(R.choice(['tent', 'large tent', 'canvas tent', 'camping tent', 'white tent', 'small tent']))} "
                      f"{R.choice(['lit up at night', 'under the stars', 'between two trees', 'in a campsite', 'next to a campfire', 'on a grassy hill'])}"),
        (0.68, lambda: f"{art(R.choice(['small island', 'rocky island', 'green island', 'tropical island']))} "
                       f"{R.choice(['in the sea', 'surrounded by blue water', 'in the middle of the ocean', 'covered in trees'])}"),
        (0.76, lambda: f"{art(R.choice(['man', 'fisherman', 'person', 'boy']))} standing on a "
                       f"{R.choice(['bamboo raft', 'wooden raft', 'raft', 'small boat'])} on "
                       f"{R.choice(['a river', 'a calm lake', 'the water'])}"),
        (0.82, lambda: f"a river winding between {R.choice(['green hills', 'steep hills', 'rice fields', 'tall trees'])} "
                       f"{R.choice(MOUNTAIN_SKY)}"),
        (0.9, lambda: f"a close up of {R.choice(['a single snowflake', 'a tiny snowflake', 'a snowflake', 'a star shaped snowflake'])} "
                      f"{R.choice(['on the snow', 'on a dark coat', 'on a window', 'on a glove'])}"),
        (0.95, lambda: f"snow falling on {R.choice(['pine trees', 'a quiet street', 'a field', 'a cabin'])}"),
        (1.0, lambda: f"fog over a {R.choice(['meadow', 'lake', 'forest', 'river'])} in the early morning"),
    ])


PETS = {
    "puppy": (["golden", "fluffy", "small", "brown", "white", "sleepy", "little", "black"],
              ["lying on the floor", "sleeping in a dog bowl", "resting its head on its paws", "chewing a bone",
               "sitting on a blanket", "looking at the camera", "playing in the grass", "sleeping on a bed"]),
    "kitten": (["orange", "gray", "small", "tiny", "orange and white", "fluffy", "little"],
               ["sitting on a carpet", "looking up at the camera", "playing with a ball", "sleeping in a basket",
                "walking on the grass", "being held in two hands", "sitting in a box"]),
    "dog": (["golden", "brown", "small", "big", "fluffy"],
            ["lying next to its bowl", "chewing on a bone", "resting on the floor", "sleeping on a blanket"]),
}


def s_pet(R: random.Random) -> str:
    name = R.choice(list(PETS))
    adjs, acts = PETS[name]
    number = "sg" if R.random() < 0.7 else "pl"
    adj = R.choice(adjs + [""])
    act = R.choice(acts)
    if number == "sg":
        return f"{art((adj + ' ' + name).strip())} {act}"
    act = act.replace(" its ", " their ").replace("a dog bowl", "a bowl").replace("being held in two hands", "in a man's hands")
    return f"{R.choice(['two', 'three', 'several', 'a couple of'])} {adj + ' ' if adj else ''}{plural(name)} {act}"


HOLDERS = [("man", "his"), ("woman", "her"), ("girl", "her"), ("boy", "his"), ("man with a watch", "his")]


def s_small_animal(R: random.Random) -> str:
    def held() -> str:
        who, pron = R.choice(HOLDERS)
        return f"{art(who)} holding {R.choice(['three kittens', 'a puppy', 'two puppies', 'a small kitten'])} in {pron} hands"

    return pick(R.random(), [
        (0.25, lambda: f"{art(R.choice(['brown bear', 'grizzly bear', 'large bear', 'big brown bear', 'young bear']))} "
                       f"{R.choice(['walking through tall grass', 'standing in a field', 'looking at the camera', 'eating grass in a meadow', 'crossing a river'])}"),
        (0.45, lambda: f"{art(R.choice(['quokka', 'small quokka', 'furry quokka', 'cute quokka']))} "
                       f"{R.choice(['standing on its hind legs', 'sitting on the sand', 'eating a leaf', 'looking at the camera', 'next to a fence'])}"),
        (0.6, lambda: f"{art(R.choice(['tasmanian devil', 'small black animal', 'black tasmanian devil', 'wild animal']))} "
                      f"{R.choice(['with pink ears', 'looking at the camera', 'standing on a rock', 'sniffing the ground', 'in a zoo'])}"),
        (0.72, lambda: f"{art(R.choice(['kangaroo', 'koala', 'wombat', 'rabbit', 'raccoon']))} "
                       f"{R.choice(['sitting in the grass', 'near a wooden fence', 'looking at the camera', 'in a zoo enclosure'])}"),
        (0.85, held),
        (1.0, lambda: f"a {R.choice(['small', 'furry', 'curious', 'little'])} animal with round ears and a black nose"),
    ])


def s_toast(R: random.Random) -> str:
    drinks = R.choice(["cups of coffee", "lattes", "coffee cups", "glasses of wine", "mugs of coffee",
                       "glasses of juice"])
    return pick(R.random(), [
        (0.35, lambda: f"{R.choice(['friends', 'three people', 'two people', 'a group of people'])} toasting with {drinks} "
                       f"{R.choice(['at a table', 'in a cafe', 'over a wooden table', 'at a restaurant'])}"),
        (0.6, lambda: f"hands holding {drinks} together over a {R.choice(['table', 'wooden table', 'cafe table'])}"),
        (0.8, lambda: f"a latte with {R.choice(['leaf', 'heart', 'flower'])} art in a "
                      f"{R.choice(['white', 'small', 'ceramic'])} cup"),
        (1.0, lambda: f"a glass of iced coffee next to {R.choice(['two lattes', 'a cup of tea', 'a plate of cookies'])}"),
    ])


def s_landmark(R: random.Random) -> str:
    return pick(R.random(), [
        (0.35, lambda: f"a {R.choice(['large', 'tall', 'modern', 'shiny'])} structure made of metal spheres "
                       f"{R.choice(['against a blue sky', 'in a park', 'on a sunny day'])}"),
        (0.6, lambda: f"looking up at {R.choice(['a tall building', 'a steel tower', 'a modern sculpture', 'shiny metal balls'])} "
                      f"{R.choice(['against the sky', 'on a clear day', 'from below'])}"),
        (0.8, lambda: f"a {R.choice(['silver', 'steel', 'metal', 'giant'])} sphere on top of "
                      f"{R.choice(['a building', 'a tower', 'a pole'])}"),
        (1.0, lambda: f"tourists taking pictures of a famous {R.choice(['monument', 'building', 'tower', 'sculpture'])}"),
    ])


def s_bin(R: random.Random) -> str:
    cont = art(R.choice(["red plastic bin", "red tote", "plastic box", "storage bin", "cardboard box", "blue bin"]))
    a, b = R.sample(["a book", "a bar of soap", "a pair of scissors", "paper towels", "a toothbrush", "a bottle",
                     "a roll of tape", "a pencil", "some keys", "a sponge", "a toy", "a mouse trap"], 2)
    return pick(R.random(), [
        (0.4, lambda: f"{cont} holding {a} and {b}"),
        (0.65, lambda: f"an overhead view of {cont} full of "
                       f"{R.choice(['household items', 'toys', 'office supplies', 'different objects'])}"),
        (0.85, lambda: f"{a} and {b} lying in {cont}"),
        (1.0, lambda: f"a robot arm picking up {a} from {cont}"),
    ])


def s_critters(R: random.Random) -> str:
    """Geese, eagles and other birds, insects, beetles and other small invertebrates."""
    return pick(R.random(), [
        (0.2, lambda: f"{art(R.choice(['goose', 'gray goose', 'brown goose', 'wild goose', 'white goose']))} "
                      f"{R.choice(['walking on the grass', 'standing by a pond', 'grazing on a lawn', 'swimming on a lake', 'resting in a park'])}"),
        (0.32, lambda: f"{R.choice(['two', 'three', 'a flock of', 'several'])} geese "
                       f"{R.choice(['walking across a lawn', 'standing near the water', 'eating grass in a park', 'flying over a field'])}"),
        (0.47, lambda: f"{art(R.choice(['eagle', 'bald eagle', 'golden eagle', 'large eagle', 'young eagle']))} "
                       f"{R.choice(['flying over the water', 'perched on a dead branch', 'spreading its wings', 'diving toward a river', 'soaring above the trees'])}"),
        (0.57, lambda: f"{R.choice(['two', 'three', 'several'])} {R.choice(['white', 'black', 'small', 'gray'])} birds "
                       f"{R.choice(['sitting on a power line', 'perched on a wire', 'standing on a fence', 'resting on a roof'])}"),
        (0.72, lambda: f"{art(R.choice(['small', 'green', 'tiny', 'striped', 'colorful']) + ' insect')} "
                       f"{R.choice(['sitting on a leaf', 'crawling up a stem', 'resting on a flower', 'on a blade of grass', 'on a green plant'])}"),
        (0.86, lambda: f"{art(R.choice(['black', 'shiny', 'small', 'large', 'green']) + ' beetle')} "
                       f"{R.choice(['crawling on a log', 'walking across the sand', 'climbing a twig', 'resting on a rock', 'on the forest floor'])}"),
        (0.94, lambda: f"a macro photo of {R.choice(['a snail', 'a spider', 'a beetle', 'an ant', 'a worm'])} and other "
                       f"invertebrates {R.choice(['on a leaf', 'under a rock', 'in the garden', 'on the ground'])}"),
        (1.0, lambda: f"a close up of {R.choice(['an insect', 'a beetle', 'a bug'])} with "
                      f"{R.choice(['shiny wings', 'long legs', 'red eyes', 'a striped back'])} on {R.choice(['a leaf', 'a twig', 'the bark'])}"),
    ])


def s_gear(R: random.Random) -> str:
    """Off-road vehicles and their tires, old cannons and weapons, footwear and shorts, furniture, lab beakers,
    strawberries."""
    def offroad() -> str:
        car = art(f"{R.choice(['silver', 'blue', 'black', 'muddy', 'white', 'red'])} "
                  f"{R.choice(['suv', 'jeep', 'four wheel drive', 'off road vehicle', 'pickup truck'])}")
        return (f"{car} {R.choice(['driving over rocks', 'on a dirt road', 'climbing a rocky hill', 'parked on a gravel track', 'crossing a shallow stream'])}")

    return pick(R.random(), [
        (0.18, offroad),
        (0.26, lambda: f"the {R.choice(['muddy', 'large', 'new', 'worn', 'black'])} tires of "
                       f"{art(R.choice(['jeep', 'truck', 'tractor', 'car', 'vehicle']))} {R.choice(['on a dirt road', 'in the mud', 'on the rocks'])}"),
        (0.36, lambda: f"{art(R.choice(['old', 'rusty', 'antique', 'iron', 'bronze']) + ' cannon')} "
                       f"{R.choice(['on the wall of a fort', 'in front of a museum', 'on two wooden wheels', 'pointing out to sea', 'in a city park'])}"),
        (0.42, lambda: f"old weapons {R.choice(['such as swords and cannons', 'and suits of armor', 'and shields'])} "
                       f"on display in {R.choice(['a museum', 'a castle', 'a glass case'])}"),
        (0.52, lambda: f"{art(R.choice(['black', 'brown', 'leather', 'new', 'polished']) + ' ' + R.choice(['shoe', 'boot', 'sneaker', 'sandal']))} "
                       f"{R.choice(['on a white background', 'next to a pair of socks', 'on a wooden floor', 'in a shop window'])}"),
        (0.57, lambda: f"{R.choice(['shelves', 'rows', 'a display'])} of {R.choice(['leather', 'colorful', 'new'])} footwear "
                       f"in {R.choice(['a shoe store', 'a shop window', 'a closet'])}"),
        (0.65, lambda: f"{art(R.choice(['man', 'woman', 'boy', 'hiker', 'runner']))} in "
                       f"{R.choice(['shorts', 'cargo shorts', 'khaki shorts', 'running shorts'])} "
                       f"{R.choice(['walking a dog', 'standing on the grass', 'hiking up a trail', 'sitting on a bench'])}"),
        (0.74, lambda: f"{R.choice(['folding', 'wooden', 'red', 'plastic', 'garden'])} chairs and other furniture "
                       f"{R.choice(['in a large hall', 'on a patio', 'in a furniture store', 'stacked in a corner'])}"),
        (0.84, lambda: f"{art(R.choice(['glass', 'small', 'large', 'plastic']) + ' beaker')} "
                       f"{R.choice(['filled with green liquid', 'on a lab bench', 'next to a bottle', 'with a measuring scale'])}"),
        (0.88, lambda: f"{art(R.choice(['scientist', 'student', 'woman', 'man']))} pouring "
                       f"{R.choice(['water', 'a liquid', 'oil'])} into {R.choice(['a beaker', 'a glass beaker', 'a test tube'])}"),
        (1.0, lambda: f"{R.choice(['a bowl of', 'a basket of', 'a plate of', 'a handful of'])} "
                      f"{R.choice(['fresh', 'ripe', 'red', 'small'])} strawberries "
                      f"{R.choice(['on a table', 'on a cutting board', 'in the sun', 'next to a knife'])}"),
    ])


MAKERS: list[tuple[Callable[[random.Random], str], float]] = [
    (s_person, 30), (s_portrait, 8), (s_space_person, 4), (s_animal, 14), (s_cat_face, 4), (s_vehicle, 14),
    (s_motorcycle_detail, 3), (s_rocket_detail, 4), (s_camera, 4), (s_table, 9), (s_building, 7),
    (s_landscape, 4), (s_flower, 5), (s_sky, 6), (s_ground, 6), (s_paper, 7), (s_flag, 2), (s_objects, 6),
    (s_wildlife, 4), (s_face, 3),
    (s_fish, 8), (s_sea_life, 4), (s_gadget, 10), (s_stage, 2), (s_mountain, 6), (s_outdoors, 10), (s_pet, 6),
    (s_small_animal, 4), (s_toast, 2), (s_landmark, 2), (s_bin, 2), (s_critters, 4), (s_gear, 5),
]


def tidy(s: str) -> str:
    return " ".join(s.split()).lower()


def norm(s: str) -> str:
    return " ".join("".join(ch if ch.isalnum() else " " for ch in s.lower()).split())


def generate(n: int, seed: int) -> list[str]:
    R = random.Random(seed)
    makers, weights = zip(*MAKERS, strict=True)
    seen: set[str] = set()
    out: list[str] = []
    tries = 0
    while len(out) < n and tries < n * 50:
        tries += 1
        maker = R.choices(makers, weights)[0]
        s = tidy(maker(R))
        k = norm(s)
        if k in seen or not 6 <= len(s.split()) <= 16:
            continue
        seen.add(k)
        out.append(s)
    if len(out) < n:
        raise SystemExit(f"grammar produced only {len(out)} distinct sentences (wanted {n})")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=2020)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--check", action="store_true", help="only compare with the existing file")
    args = ap.parse_args(argv)
    text = "\n".join(generate(args.n, args.seed)) + "\n"
    if args.check:
        same = args.out.exists() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from the generator output'}")
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}: {args.n} sentences, {len(text.encode())} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
