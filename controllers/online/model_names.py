"""The served model's size from its name: ``Llama-3.1-70B-Instruct`` is 70 billion
parameters, ``Mixtral-8x7B`` about 45 billion of which about 12 are active per token,
``Qwen3-30B-A3B`` 30 billion with 3 active.

An engine labels its metrics with the served model's name (vLLM's and SGLang's
``model_name``), and most public checkpoints carry their parameter count in it. That
is enough for a rough prior (:mod:`controllers.online.prior`) on a node nobody
described: :func:`hints_from_model_name` reads it, and returns None when the name
states no size (``deepseek-ai/DeepSeek-V3``, ``microsoft/phi-4``) rather than guess.

What counts as a size: a number directly followed by ``B`` (billions) or ``M``
(millions, 50M or more: ``1M`` is a context length), standing alone between separators
(``-``, ``_``, ``/``, ``.``, space, brackets): ``70B``, ``7b``, ``1.5B``, ``0.5B``,
``405B``, ``135M``, and ``1_8B`` (an underscore for the point). ``NxMB`` is a mixture of
``N`` experts of an ``M``-billion model (``8x7B``, ``8x22B``); ``A3B``/``A22B``
(``A800M``) gives the parameters active per token. A
version (``v0.1``, ``3.1``), a date (``2407``), a context length (``128k``, ``1M``), a
quantisation (``4bit``, ``bf16``) or a GPU (``A100``) is not a size.

Some mixtures' names state only one of their two sizes, or none: ``gpt-oss-120b`` is
117 billion with 5.1 active, and Llama 4's ``17B-16E`` names the 17 billion active of
109 in all. Read by the rule above they would be priced as dense models, wrong by up to
twenty times in the parameters each token reads. Those families' published sizes come
from :data:`PUBLISHED_SIZES` first; any other name with an ``NE`` experts count states
its active size only and gives None, and so does a name that says ``MoE`` but states
one size with no ``A`` active size (``deepseek-moe-16b`` is 16.4 billion with 2.8 active,
``LLaMA-MoE-3.5B`` 6.7 with 3.5).
"""

from __future__ import annotations

import re
from typing import NamedTuple

_EDGE_BEFORE = r"(?<![A-Za-z0-9.])"
_EDGE_AFTER = r"(?![A-Za-z0-9])"
_NUMBER = r"(\d{1,5}(?:\.\d{1,3})?)"
MIXTURE = re.compile(rf"{_EDGE_BEFORE}(\d{{1,3}})[xX]{_NUMBER}([bB]){_EDGE_AFTER}")
ACTIVE = re.compile(rf"{_EDGE_BEFORE}[aA]{_NUMBER}([bBmM]){_EDGE_AFTER}")
PLAIN = re.compile(rf"{_EDGE_BEFORE}{_NUMBER}([bBmM]){_EDGE_AFTER}")
UNDERSCORE_POINT = re.compile(
    r"(?<![A-Za-z0-9._])([aA]?\d{1,3})_(\d{1,3})(?=[bBmM](?![A-Za-z0-9]))"
)
"""A size written with an underscore for its decimal point (``Qwen-1_8B``,
``internlm2-chat-1_8b``, ``stablelm-2-1_6b``): read as ``1.8B``. Not after a digit and an
underscore, where the first number is a version (``Qwen2_5_7B`` is 7B)."""

SHARED_FRACTION = 0.22
"""Of an ``NxMB`` mixture's ``M``-billion base model, the share every token uses
(attention, embeddings, norms); the rest is the feed-forward network each expert
replaces. Mixtral-8x7B (46.7B total, 12.9B active of a 7.2B base) and Mixtral-8x22B
(141B, 39B of 22B) both give 0.22-0.23."""
EXPERTS_PER_TOKEN = 2
"""Experts an ``NxMB`` mixture routes each token to (Mixtral's top-2)."""
SMALLEST_MILLIONS = 50.0
"""``M`` sizes below this are context lengths (``1M``), not models."""
LARGEST_BILLIONS = 10_000.0
EXPERT_COUNT = re.compile(r"(?<![A-Za-z0-9.])\d{1,4}[eE](?![A-Za-z0-9])")
"""An ``NE`` experts count (Llama 4's ``17B-16E``): the size beside it is the active one."""
MIXTURE_MARK = re.compile(r"moe", re.I)
"""A name that says it is a mixture of experts (``deepseek-moe-16b``, ``JetMoE-8B``,
``LLaMA-MoE-3.5B``): a size it states alone may be the total or the active one."""


class ModelSize(NamedTuple):
    """Parameters of a served model, billions: in all, and active per token (an MoE's
    are fewer; a dense model's are the same)."""

    params_b: float
    active_params_b: float


PUBLISHED_SIZES: tuple[tuple[re.Pattern[str], ModelSize], ...] = (
    # gpt-oss model card: 117B with 5.1B active; 21B with 3.6B active (also spelled
    # gpt_oss_120b, or gpt-oss:120b as an Ollama-style tag); gpt-oss-safeguard-120b and
    # -20b are the same models fine-tuned.
    (re.compile(r"gpt[-_ ]?oss\D*?(?<![\d.])120b", re.I), ModelSize(117.0, 5.1)),
    (re.compile(r"gpt[-_ ]?oss\D*?(?<![\d.])20b", re.I), ModelSize(21.0, 3.6)),
    # Llama 4 model card: 17B activated of 109B (Scout, 16 experts), of 400B (Maverick,
    # 128); also spelled llama4, or tagged by its experts of the active size (16x17b).
    (re.compile(r"llama[-_ ]?4[-_: ](?:scout|16x17b)", re.I), ModelSize(109.0, 17.0)),
    (re.compile(r"llama[-_ ]?4[-_: ](?:maverick|128x17b)", re.I), ModelSize(400.0, 17.0)),
    # DeepSeek model cards: V3, R1 and Prover-V2-671B (V3's base) 671B with 37B
    # activated; V2 236B with 21B; V2-Lite 15.7B with 2.4B. R1's distilled models are
    # dense and name their size (a size that is not 671B: PUBLISHED_MATCH).
    (
        re.compile(r"deepseek-(?:v3|r1|prover-v2-671b)(?!.*distill)", re.I),
        ModelSize(671.0, 37.0),
    ),
    # Coder-V2 is V2's shape (236B with 21B; its Lite 16B with 2.4B); a tag that names
    # the total alone (deepseek-v2:16b, deepseek-coder-v2:16b) is the Lite.
    (
        re.compile(r"deepseek-(?:coder-)?v2(?:\.5)?(?:-lite|\D*?(?<![\d.])16b)", re.I),
        ModelSize(15.7, 2.4),
    ),
    (re.compile(r"deepseek-(?:coder-)?v2(?!.*lite)", re.I), ModelSize(236.0, 21.0)),
    # Qwen3 model cards: 30B-A3B 30.5B with 3.3B activated, 235B-A22B 235B with 22B,
    # Coder-480B-A35B 480B with 35B; Qwen3 has no dense 30B, 235B or 480B, so a tag that
    # names the total alone (qwen3:30b, qwen3-coder:480b) is the mixture. A name that
    # states the active size too is read as it states it.
    *(
        (
            re.compile(rf"qwen3(?:[-_ ]?coder)?[-_: ](?:\S*?[-_:])?{total}b(?![-_:. ]?a\d)", re.I),
            size,
        )
        for total, size in (
            ("30", ModelSize(30.5, 3.3)),
            ("235", ModelSize(235.0, 22.0)),
            ("480", ModelSize(480.0, 35.0)),
        )
    ),
    # Kimi K2 model card: 1 trillion in all, 32B activated.
    (re.compile(r"kimi-k2", re.I), ModelSize(1000.0, 32.0)),
    # GLM-4.5 model card: 355B with 32B active; GLM-4.5-Air 106B with 12B.
    (re.compile(r"glm-4\.5-air", re.I), ModelSize(106.0, 12.0)),
    (re.compile(r"glm-4\.5(?!.*air)(?!v)", re.I), ModelSize(355.0, 32.0)),
    # OLMoE model card: 6.9B in all, 1.3B active, named active size first (1B-7B).
    (re.compile(r"olmoe-1b-7b", re.I), ModelSize(6.9, 1.3)),
)
"""Mixtures whose names do not state both sizes, with their model cards' figures: the
first pattern found in a name wins, unless the name states a size that is neither of
its figures (:data:`PUBLISHED_MATCH`)."""

PUBLISHED_MATCH = 0.1
"""How far, relative, a size a name states may be from its family's published total or
active size and still be that model (``gpt-oss-120b`` is 117B): a name that states
another size is another model named after the family (``DeepSeek-R1-0528-Qwen3-8B``, a
dense 8B distilled from DeepSeek-R1), read by the size rule."""
ROUNDED_B = 0.5
"""The same, absolute, in billions: a size rounded to a whole billion (OLMoE's ``1B``
is 1.3B)."""


MODELS_APART = re.compile(r",(?![^()\[\]]*[)\]])")
"""The commas between models' names: not those within brackets, which describe one model
(a bundled profile's ``Llama-3.2-3B-Instruct (BF16, TP=1)``)."""


def hints_from_model_name(name: str | None) -> ModelSize | None:
    """The model size a served model's name states, or None when it states none.

    Several models' names joined with commas (a page that serves several) give the size
    they all state, or None where they do not all state one and the same: sizes taken
    across them made a model none of them is (a 70B total with another model's 3B
    active). One model's name is read by :func:`size_of_one_name`.
    """
    if not name:
        return None
    sizes = {size_of_one_name(part) for part in served_models(name)}
    return sizes.pop() if len(sizes) == 1 else None


def served_models(name: str) -> list[str]:
    """The models a served-model name joins with commas (one where it joins none), each
    stripped: a page that serves several names them all (:data:`MODELS_APART`)."""
    return [part.strip() for part in MODELS_APART.split(name)]


def size_of_one_name(name: str) -> ModelSize | None:
    """The model size one served model's name states, or None when it states none.

    A family in :data:`PUBLISHED_SIZES` gets its published sizes. ``8x7B`` counts as a
    mixture (:data:`SHARED_FRACTION`, :data:`EXPERTS_PER_TOKEN`); ``A3B`` sets the
    active parameters of the total a plain size gives (an ``A`` size with no total, or a
    size beside an ``NE`` experts count, or in a name that says ``MoE``, is ambiguous:
    None). Several plain sizes: the largest (a distilled ``...-Llama-70B`` names its own
    size last, but a name never lists a smaller model than the one served).
    """
    if not name:
        return None
    name = UNDERSCORE_POINT.sub(r"\1.\2", name)
    stated = _plain_sizes(name)
    for pattern, published in PUBLISHED_SIZES:
        if pattern.search(name) and all(
            any(
                abs(size - figure) <= max(PUBLISHED_MATCH * figure, ROUNDED_B)
                for figure in published
            )
            for size in stated
        ):
            return published
    if EXPERT_COUNT.search(name):
        return None
    mixture = MIXTURE.search(name)
    if mixture is not None:
        experts = int(mixture.group(1))
        base = float(mixture.group(2))
        if experts < 1 or not 0.0 < base <= LARGEST_BILLIONS:
            return None
        shared = SHARED_FRACTION * base
        total = shared + experts * (base - shared)
        active = shared + min(experts, EXPERTS_PER_TOKEN) * (base - shared)
        return ModelSize(round(total, 3), round(min(active, total), 3))
    active_match = ACTIVE.search(name)
    if not stated or (active_match is None and MIXTURE_MARK.search(name)):
        return None
    total = max(stated)
    active = total
    if active_match is not None:
        given = _billions(active_match.group(1), active_match.group(2))
        if given is not None and given <= total:
            active = given
    return ModelSize(total, active)


def _billions(number: str, unit: str) -> float | None:
    """A stated size in billions (``M``: millions), or None where it is no model size (a
    context length such as ``1M``, or beyond :data:`LARGEST_BILLIONS`)."""
    value = float(number)
    if unit in "mM":
        if value < SMALLEST_MILLIONS:
            return None
        value /= 1000.0
    return value if 0.0 < value <= LARGEST_BILLIONS else None


def _plain_sizes(name: str) -> list[float]:
    """The sizes a name states outside an active-parameter token (``A3B``, ``a800m``)."""
    masked = ACTIVE.sub(" ", name)
    found = (_billions(match.group(1), match.group(2)) for match in PLAIN.finditer(masked))
    return [size for size in found if size is not None]


NAME_SETTLE_OBSERVATIONS = 3
"""Observations in a row a new served-model name must hold before it counts as a new model."""


class SettledName:
    """The served model's name as a controller acts on it: the first name at once, a new
    one only once it has held :data:`NAME_SETTLE_OBSERVATIONS` observations in a row. A
    model is swapped by restarting the engine, which a few ticks' wait costs nothing; a
    label that flaps (a misconfigured engine, two answering in turn) is not a new model
    at every tick, which would throw the learned model away each time."""

    def __init__(self) -> None:
        self._pending: str | None = None
        self._seen = 0

    def update(self, name: str | None, current: str | None) -> str | None:
        """Fold one observation's ``name`` in, ``current`` being the name the caller holds
        (None: none yet); return the name to hold now."""
        if name is None or name == current:
            self._pending, self._seen = None, 0
            return current
        if current is None:
            return name
        if name != self._pending:
            self._pending, self._seen = name, 0
        self._seen += 1
        if self._seen < NAME_SETTLE_OBSERVATIONS:
            return current
        self._pending, self._seen = None, 0
        return name


__all__ = [
    "NAME_SETTLE_OBSERVATIONS",
    "PUBLISHED_SIZES",
    "ModelSize",
    "SettledName",
    "hints_from_model_name",
    "served_models",
    "size_of_one_name",
]
