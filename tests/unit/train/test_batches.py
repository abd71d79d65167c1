"""What a batch may be: tensors in tuples, lists, named tuples, dicts (nested), dataclasses and other
objects, moved to the device as a whole with their types kept; its sample count and its description."""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from torchslurm.train.batches import describe, first_tensor, samples, to_device

META = torch.device("meta")  # a device every machine has: moved tensors say so, without a GPU


class Pair(NamedTuple):
    x: torch.Tensor
    y: torch.Tensor


@dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    name: str


class Plain:
    def __init__(self) -> None:
        self.x, self.note = torch.ones(2), "kept"


class MovesItself(dict):  # type: ignore[type-arg]  # e.g. Hugging Face's BatchEncoding
    def to(self, device: torch.device) -> dict[str, Any]:
        return {"moved_by": "itself", **{k: v.to(device) for k, v in self.items()}}


def test_nested_containers_move_whole_and_keep_their_types() -> None:
    batch = {"input": {"ids": torch.ones(2, 3), "mask": [torch.ones(2), "text"]}, "labels": torch.zeros(2),
             "pair": Pair(torch.ones(1), torch.zeros(1)), "n": 7, "none": None, "tuple": (torch.ones(1), 2.0)}
    moved = to_device(batch, META)
    assert moved["input"]["ids"].device == META and moved["input"]["mask"][0].device == META
    assert moved["input"]["mask"][1] == "text" and moved["n"] == 7 and moved["none"] is None
    assert type(moved["pair"]) is Pair and moved["pair"].y.device == META
    assert type(moved["tuple"]) is tuple and moved["tuple"][1] == 2.0
    assert batch["labels"].device.type == "cpu"  # the original batch is left as it was


def test_mappings_dataclasses_and_objects_keep_their_type_where_it_can_be_rebuilt() -> None:
    ordered = to_device(OrderedDict(a=torch.ones(1)), META)
    assert type(ordered) is OrderedDict and ordered["a"].device == META
    fallback = to_device(defaultdict(list, a=torch.ones(1)), META)  # defaultdict(items) is no defaultdict
    assert fallback == {"a": fallback["a"]} and fallback["a"].device == META
    frozen = to_device(Frozen(torch.ones(1), "x"), META)
    assert isinstance(frozen, Frozen) and frozen.x.device == META and frozen.name == "x"
    original = Plain()
    plain = to_device(original, META)
    assert plain is not original and plain.x.device == META and plain.note == "kept" and original.x.device.type == "cpu"
    assert to_device(MovesItself(a=torch.ones(1)), META)["moved_by"] == "itself"
    assert to_device("just text", META) == "just text"


def test_samples_is_the_length_of_the_first_tensor() -> None:
    assert samples({"text": ["a", "b"], "ids": torch.ones(5, 3), "labels": torch.ones(4)}) == 5
    assert samples((torch.ones(6, 2), torch.ones(6), torch.arange(6))) == 6
    assert samples(Plain()) == 2 and samples(torch.tensor(3.0)) == 1 and samples({"text": "a"}) == 1
    assert first_tensor(Frozen(torch.ones(3), "x")) is not None and first_tensor(["a", 1]) is None


def test_describe_shows_the_structure_a_message_names() -> None:
    assert describe((torch.ones(32, 10), torch.ones(32), torch.ones(32))) == "(Tensor[32, 10], Tensor[32], Tensor[32])"
    assert describe([torch.ones(32, 10), torch.ones(32), torch.ones(32)]) == "[Tensor[32, 10], Tensor[32], Tensor[32]]"
    assert describe({"input_ids": torch.ones(8, 4, dtype=torch.long), "text": ["a"] * 8}) == \
        "dict(input_ids=Tensor[8, 4], text=[str × 8])"
    assert describe(Plain()) == "Plain"
