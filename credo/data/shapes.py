"""``shapes``: a synthetic visual question task a tiny vision-language model learns on CPU
(docs/algorithms/vepo.md#images, [derived]).

A 32x32 black canvas holds 1-3 shapes, one per 16x16 quadrant (so they never overlap): square, circle or
triangle, side 10-13 px, jittered inside the quadrant, coloured red, green, blue or yellow. Questions
(``kind``):

- ``color``: ``"what color is the square?"`` about a shape present exactly once -> ``"red"``
- ``count``: ``"how many circles?"`` -> ``"0"`` .. ``"3"``
- ``where``: ``"where is the blue shape?"`` about a colour present exactly once -> ``"top left"``

``answer_style: sentence`` answers ``"it is red."`` / ``"there are 2."`` instead (template characters that do not
depend on the image). Each example carries ``meta["image"]`` (uint8 (32, 32, 3)), ``meta["scene"]`` (the objects:
kind, colour, quadrant, box ``[x0, y0, x1, y1)``), ``meta["question"]`` and ``meta["regions"]`` (the boxes of the
queried shape, or of every shape of the counted kind). The prompt is ``"<image>"`` + the question; the recipe widens
the placeholder to the model's image-token count (:func:`credo.models.vision.expand_image_prompts`).

Shapes are drawn with numpy masks (pixel centres inside the square / circle / triangle), not PIL, so the task needs
no imaging library. The verifier ``shapes`` (:mod:`credo.rewards.shapes`) is an exact match after stripping, lower-casing and dropping a final
``"."``. Splits: held-out and train examples come from separate seeded RNGs; an eval example is distinct from the
other eval examples and from every train example as (question, scene).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from credo.data.tasks import MAX_CONSECUTIVE_COLLISIONS, Task, _check_int, _split_rng, register_task
from credo.types import Example

SIZE = 32
QUADRANT = SIZE // 2
KINDS = ("square", "circle", "triangle")
PLURAL = {"square": "squares", "circle": "circles", "triangle": "triangles"}
COLORS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "yellow": (255, 255, 0)}
QUADRANTS = {"top left": (0, 0), "top right": (QUADRANT, 0), "bottom left": (0, QUADRANT),
             "bottom right": (QUADRANT, QUADRANT)}
QUESTION_KINDS = ("color", "count", "where")
IMAGE_PLACEHOLDER = "<image>"


def shape_mask(kind: str, box: list[int], size: int = SIZE) -> np.ndarray:
    """(size, size) bool: pixels whose centres lie inside the shape drawn in ``box = [x0, y0, x1, y1)``.

    square: the whole box; circle: (x - cx)^2 + (y - cy)^2 <= (side / 2)^2; triangle: apex at the top middle, base
    on the bottom edge, |x - cx| <= (y - y0) / (y1 - y0) * side / 2."""
    x0, y0, x1, y1 = box
    ys, xs = np.mgrid[0:size, 0:size].astype(np.float64) + 0.5  # pixel centres
    inside = (xs >= x0) & (xs < x1) & (ys >= y0) & (ys < y1)
    cx, cy, side = (x0 + x1) / 2, (y0 + y1) / 2, x1 - x0
    if kind == "square":
        return inside
    if kind == "circle":
        return inside & ((xs - cx) ** 2 + (ys - cy) ** 2 <= (side / 2) ** 2)
    if kind == "triangle":
        return inside & (np.abs(xs - cx) <= (ys - y0) / (y1 - y0) * side / 2)
    raise ValueError(f"unknown shape {kind!r}; shapes: {', '.join(KINDS)}")


def render(scene: list[dict[str, Any]], size: int = SIZE) -> np.ndarray:
    """The scene's image, uint8 (size, size, 3), black background."""
    img = np.zeros((size, size, 3), dtype=np.uint8)
    for obj in scene:
        img[shape_mask(obj["kind"], obj["box"], size)] = COLORS[obj["color"]]
    return img


def random_scene(rng: random.Random, min_shapes: int, max_shapes: int) -> list[dict[str, Any]]:
    """1-3 objects in distinct quadrants (quadrant order: top left, top right, bottom left, bottom right)."""
    names = rng.sample(list(QUADRANTS), rng.randint(min_shapes, max_shapes))
    scene = []
    for name in sorted(names, key=list(QUADRANTS).index):
        qx, qy = QUADRANTS[name]
        side = rng.randint(10, 13)
        x0, y0 = qx + rng.randint(0, QUADRANT - side), qy + rng.randint(0, QUADRANT - side)
        scene.append({"kind": rng.choice(KINDS), "color": rng.choice(list(COLORS)), "quadrant": name,
                      "box": [x0, y0, x0 + side, y0 + side]})
    return scene


def resample_scene(scene: list[dict[str, Any]], question: dict[str, Any], rng: random.Random) -> list[dict]:
    """The same layout with the queried attribute redrawn (an in-distribution counterfactual): every colour
    (``color``, ``where``) or every kind (``count``) drawn anew, each different from the original."""
    attr, pool = ("kind", KINDS) if question["kind"] == "count" else ("color", tuple(COLORS))
    return [dict(obj, **{attr: rng.choice([v for v in pool if v != obj[attr]])}) for obj in scene]


def _question(kind: str, scene: list[dict], rng: random.Random, style: str) -> tuple[str, str, list, dict] | None:
    """(question, answer, regions, question meta), or None when the scene cannot ask this kind."""
    if kind == "count":
        shape = rng.choice(KINDS)
        boxes = [o["box"] for o in scene if o["kind"] == shape]
        answer = str(len(boxes))
        return (f"how many {PLURAL[shape]}?", answer if style == "bare" else f"there are {answer}.", boxes,
                {"kind": kind, "shape": shape})
    attr = "kind" if kind == "color" else "color"
    unique = [o for o in scene if sum(p[attr] == o[attr] for p in scene) == 1]
    if not unique:
        return None
    obj = rng.choice(unique)
    if kind == "color":
        q, a = f"what color is the {obj['kind']}?", obj["color"]
    else:
        q, a = f"where is the {obj['color']} shape?", obj["quadrant"]
    return q, a if style == "bare" else f"it is {a}.", [obj["box"]], {"kind": kind, attr: obj[attr]}


@register_task("shapes")
@dataclass
class ShapesTask(Task):
    """Questions about a rendered scene of coloured shapes (module docstring)."""

    default_reward: ClassVar[str] = "shapes"

    kind: str = "color"  # color | count | where | mixed (each example draws one of the three)
    answer_style: str = "bare"  # bare ("red") | sentence ("it is red.")
    min_shapes: int = 1
    max_shapes: int = 3

    def __post_init__(self) -> None:
        if self.kind not in (*QUESTION_KINDS, "mixed"):
            raise ValueError(f"task 'shapes': kind must be one of {', '.join(QUESTION_KINDS)}, mixed; "
                             f"got {self.kind!r}")
        if self.answer_style not in ("bare", "sentence"):
            raise ValueError(f"task 'shapes': answer_style must be bare or sentence, got {self.answer_style!r}")
        _check_int(self.name, "min_shapes", self.min_shapes, 1, 4)
        _check_int(self.name, "max_shapes", self.max_shapes, self.min_shapes, 4)

    def make_example(self, rng: random.Random, index: int, split: str) -> Example:
        for _ in range(MAX_CONSECUTIVE_COLLISIONS):
            scene = random_scene(rng, self.min_shapes, self.max_shapes)
            kind = rng.choice(QUESTION_KINDS) if self.kind == "mixed" else self.kind
            asked = _question(kind, scene, rng, self.answer_style)
            if asked is not None:
                q, answer, regions, question = asked
                return Example(prompt=IMAGE_PLACEHOLDER + q, answer=answer, uid=self._uid(split, index),
                               meta={"image": render(scene), "scene": scene, "regions": regions,
                                     "question": question})
        raise ValueError(f"task 'shapes' drew no scene that can ask {self.kind!r} questions")

    def splits(self, *, train_size: int, eval_size: int, seed: int) -> tuple[list[Example], list[Example]]:
        """Held-out examples distinct as (question, image); train examples never equal a held-out one."""
        eval_rng, train_rng = _split_rng(seed, self, "eval"), _split_rng(seed, self, "train")
        held: set[tuple[str, bytes]] = set()
        eval_examples = self._draw(eval_size, eval_rng, "eval", held, distinct=True)
        return self._draw(train_size, train_rng, "train", held, distinct=False), eval_examples

    def _draw(self, size: int, rng: random.Random, split: str, seen: set, *, distinct: bool) -> list[Example]:
        out: list[Example] = []
        misses = 0
        while len(out) < size:
            ex = self.make_example(rng, len(out), split)
            key = (ex.prompt, ex.meta["image"].tobytes())
            if key in seen:
                misses += 1
                if misses >= MAX_CONSECUTIVE_COLLISIONS:
                    raise ValueError(f"task 'shapes' could not draw {size} {split} examples distinct from the "
                                     "held-out ones; reduce the split sizes")
                continue
            misses = 0
            if distinct:
                seen.add(key)
            out.append(ex)
        return out
