"""A deterministic, locally generated New-Yorker-like set of captioned JPEG cartoons.

The real set (``jmhessel/newyorker_caption_contest``) holds single-panel cartoons: mostly black line
drawings on light paper, a few hundred pixels a side, with a scene description. This generator draws
comparable content (figures, furniture, hatching, gray washes) at varied sizes and writes real JPEG
files in the Hugging Face ``imagefolder`` layout (``metadata.jsonl`` with ``file_name`` and
``image_description``). Each image depends only on (generator version, seed, index), so the set is the
same on every run; it is generated once into a cache folder, atomically.
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
import time
from pathlib import Path

from PIL import Image, ImageDraw

from suite.fileio import cache_root

#: 2: the caption names what is drawn (paper tint, figures, window), so it can be learned; 3: and the rug's colour,
#: so that a model can tell 192 kinds of scene apart (recall@1 over 512 held-out pairs can rise far above chance)
GENERATOR_VERSION = 3
DEFAULT_SAMPLES = 512
DEFAULT_SEED = 0
CAPTION_COLUMN = "image_description"

_PEOPLE = ["a man in a suit", "a woman with an umbrella", "two executives", "a doctor", "a knight in armor",
           "a couple on a sofa", "a child", "a cat", "a dog in a tie", "a therapist", "a bartender", "a pirate"]
_ACTIONS = ["talks to", "stares at", "points at", "argues with", "hands a note to", "waves at", "ignores",
            "reads to", "shakes hands with", "whispers to"]
_OTHERS = ["a penguin", "a snowman", "the grim reaper", "a giant snail", "a robot", "a mermaid", "a ghost",
           "a talking lamp", "a bear", "an octopus", "a tiny elephant", "a dinosaur"]
_PLACES = ["in an office", "at a cocktail party", "on a desert island", "in a living room", "at the beach",
           "in an elevator", "at a restaurant", "in a courtroom", "on a subway car", "in a waiting room"]
_DETAILS = ["A clock on the wall shows midnight.", "The window shows a city skyline.",
            "Papers are scattered on the floor.", "A plant wilts in the corner.", "Everyone else looks bored.",
            "A sign on the wall is blank.", "Rain falls outside.", "A cake sits on the table."]


#: Paper tints (RGB) the scene is drawn on, named in the caption.
PAPERS: dict[str, tuple[int, int, int]] = {"cream": (246, 240, 222), "blue": (186, 208, 242),
                                           "pink": (244, 196, 208), "green": (196, 234, 196)}
_COUNTS = {1: "One figure", 2: "Two figures", 3: "Three figures"}
#: Rug colours (RGB), named in the caption.
RUGS: dict[str, tuple[int, int, int]] = {"red": (200, 40, 40), "orange": (235, 140, 30), "yellow": (230, 210, 40),
                                         "green": (40, 150, 60), "teal": (30, 150, 150), "purple": (120, 50, 160),
                                         "black": (30, 30, 30), "brown": (120, 75, 35)}


def caption_for(rng: random.Random, paper: str, figures: int, window: bool, rug: str) -> str:
    """What is drawn (learnable: paper tint, number of figures, a window or not, the rug's colour), then a
    New-Yorker-like scene."""
    setting = ", by a window" if window else ""
    return (f"{_COUNTS[figures]} on {paper} paper{setting}, on a {rug} rug. {rng.choice(_PEOPLE).capitalize()} "
            f"{rng.choice(_ACTIONS)} {rng.choice(_OTHERS)} {rng.choice(_PLACES)}. {rng.choice(_DETAILS)}")


def _ink(rng: random.Random) -> tuple[int, int, int]:
    level = rng.randint(0, 60)
    return (level, level, level)


def _squiggle(draw: ImageDraw.ImageDraw, rng: random.Random, w: int, h: int) -> None:
    x, y = rng.uniform(0, w), rng.uniform(0, h)
    points = [(x, y)]
    for _ in range(rng.randint(4, 14)):
        x = min(max(x + rng.uniform(-60, 60), 0), w)
        y = min(max(y + rng.uniform(-40, 40), 0), h)
        points.append((x, y))
    draw.line(points, fill=_ink(rng), width=rng.randint(1, 3), joint="curve")


def _figure(draw: ImageDraw.ImageDraw, rng: random.Random, w: int, h: int, where: float) -> None:
    cx, base = (where + rng.uniform(-0.08, 0.08)) * w, rng.uniform(0.7 * h, 0.95 * h)
    height = rng.uniform(0.35 * h, 0.6 * h)
    head = height * 0.13
    top = base - height
    ink, width = _ink(rng), rng.randint(2, 3)
    draw.ellipse([cx - head, top, cx + head, top + 2 * head], outline=ink, width=width)
    body_top, hip = top + 2 * head, base - height * 0.45
    draw.polygon([(cx - head * 1.4, body_top), (cx + head * 1.4, body_top), (cx + head * 1.1, hip),
                  (cx - head * 1.1, hip)], outline=ink, fill=(rng.randint(200, 240),) * 3)
    for side in (-1, 1):
        draw.line([(cx + side * head * 0.6, hip), (cx + side * head * rng.uniform(0.5, 1.5), base)], fill=ink,
                  width=width)
        draw.line([(cx + side * head * 1.3, body_top + head * 0.3),
                   (cx + side * head * rng.uniform(1.5, 3.5), hip + rng.uniform(-head, head))], fill=ink, width=width)


def _room(draw: ImageDraw.ImageDraw, rng: random.Random, w: int, h: int, window: bool, rug: str) -> None:
    floor = rng.uniform(0.6 * h, 0.8 * h)
    draw.line([(0, floor), (w, floor)], fill=_ink(rng), width=2)
    x0, depth = rng.uniform(0.05 * w, 0.3 * w), rng.uniform(0.1 * h, 0.15 * h)  # a wide rug on the floor
    draw.rectangle([x0, floor + 0.02 * h, x0 + rng.uniform(0.55 * w, 0.65 * w), floor + 0.02 * h + depth],
                   fill=RUGS[rug], outline=_ink(rng), width=2)
    if window:  # a large dark window with panes, upper part of the scene
        x0, y0 = rng.uniform(0.05 * w, 0.55 * w), rng.uniform(0.05 * h, 0.15 * h)
        x1, y1 = x0 + rng.uniform(0.3 * w, 0.4 * w), y0 + rng.uniform(0.3 * h, 0.4 * h)
        draw.rectangle([x0, y0, x1, y1], fill=(70, 70, 80), outline=_ink(rng), width=4)
        draw.line([((x0 + x1) / 2, y0), ((x0 + x1) / 2, y1)], fill=(220, 220, 220), width=3)
        draw.line([(x0, (y0 + y1) / 2), (x1, (y0 + y1) / 2)], fill=(220, 220, 220), width=3)
    tx = rng.uniform(0.1 * w, 0.7 * w)  # a table
    draw.rectangle([tx, floor - 50, tx + rng.uniform(80, 160), floor - 42], fill=(235, 235, 235), outline=_ink(rng))


def draw_cartoon(index: int, seed: int = DEFAULT_SEED) -> tuple[Image.Image, str]:
    """The image and caption of sample ``index`` (pure function of the arguments): figures, furniture, a rug and
    ink on tinted paper; the caption names the tint, the number of figures, whether a window is drawn and the
    rug's colour."""
    rng = random.Random(f"newyorker-synthetic-v{GENERATOR_VERSION}-{seed}-{index}")
    width, height = rng.randint(480, 800), rng.randint(400, 720)
    paper = rng.choice(list(PAPERS))
    figures = rng.randint(1, 3)
    window = rng.random() < 0.5
    rug = rng.choice(list(RUGS))
    tint = tuple(max(0, min(255, c + rng.randint(-6, 6))) for c in PAPERS[paper])
    image = Image.new("RGB", (width, height), tint)
    draw = ImageDraw.Draw(image)
    _room(draw, rng, width, height, window, rug)
    for slot in range(figures):  # spread over the width, so that they can be counted
        _figure(draw, rng, width, height, (slot + 0.5) / figures)
    for _ in range(rng.randint(3, 10)):
        _squiggle(draw, rng, width, height)
    return image, caption_for(rng, paper, figures, window, rug)


#: Written beside metadata.jsonl: how the set was made and how long it took (read back by :func:`generation_facts`).
GENERATION_FILE = "generation.json"


def generation_facts(root: Path) -> dict[str, object]:
    """What :data:`GENERATION_FILE` says about the synthetic set in ``root`` (empty for sets made before it)."""
    try:
        return dict(json.loads((root / GENERATION_FILE).read_text()))
    except (OSError, ValueError):
        return {}


def synthetic_dir(samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED, root: Path | None = None) -> Path:
    return (root or cache_root()) / "bridgetower" / f"synthetic-newyorker-v{GENERATOR_VERSION}-n{samples}-s{seed}"


def ensure_synthetic(samples: int = DEFAULT_SAMPLES, seed: int = DEFAULT_SEED, root: Path | None = None) -> Path:
    """The folder of the synthetic set, generated on first use (atomically: a folder is complete or absent)."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1, got {samples}")
    target = synthetic_dir(samples, seed, root)
    if (target / "metadata.jsonl").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        started = time.perf_counter()
        with open(staging / "metadata.jsonl", "w") as meta:
            for index in range(samples):
                image, caption = draw_cartoon(index, seed)
                name = f"{index:05d}.jpg"
                image.save(staging / name, format="JPEG", quality=90)
                meta.write(json.dumps({"file_name": name, CAPTION_COLUMN: caption}) + "\n")
        (staging / GENERATION_FILE).write_text(json.dumps({
            "samples": samples, "seed": seed, "generator_version": GENERATOR_VERSION,
            "generation_s": round(time.perf_counter() - started, 2)}))
        try:
            staging.rename(target)
        except OSError:
            if not (target / "metadata.jsonl").exists():  # lost a race only if the winner finished
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
