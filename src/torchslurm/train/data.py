"""Datasets that need no network: sklearn's bundled digits, MNIST from local IDX files,
synthetic data of any shape, and an image folder when torchvision is installed.

Every loader returns `(train, val)` datasets of `(input, label)` pairs; splits are a pure
function of their seed, so every rank builds exactly the same split without talking.
"""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import logging
import struct
from collections.abc import Iterator, Sequence, Sized
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import BatchSampler, DataLoader, Dataset, DistributedSampler, Sampler, Subset, TensorDataset

from torchslurm.errors import ConfigError, not_one_of
from torchslurm.train.config import DATASETS

logger = logging.getLogger(__name__)

Split = tuple[Dataset[Any], Dataset[Any]]

# IDX type codes (http://yann.lecun.com/exdb/mnist/, "THE IDX FILE FORMAT").
_IDX_DTYPES: dict[int, str] = {0x08: "u1", 0x09: "i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
               "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def digits(val_fraction: float = 0.2, split_seed: int = 0) -> Split:
    """scikit-learn's bundled 8×8 digits (1,797 images, no download), as (N, 1, 8, 8) floats."""
    table = np.loadtxt(_digits_file(), delimiter=",", dtype=np.float32)
    images = table[:, :-1].reshape(-1, 8, 8) / 16.0
    images = (images - images.mean()) / images.std()
    return _split(images[:, None, :, :], table[:, -1].astype(np.int64), val_fraction, split_seed)


def _digits_file() -> Path:
    """The CSV that `sklearn.datasets.load_digits` reads, found without importing scikit-learn
    (whose import costs every rank about two seconds of start-up)."""
    spec = importlib.util.find_spec("sklearn")
    found = [Path(d) / "datasets" / "data" / "digits.csv.gz" for d in (spec.submodule_search_locations or [])
             ] if spec else []
    if not found or not found[0].is_file():
        raise ConfigError(
            "dataset=digits needs scikit-learn's bundled digits data; scikit-learn is not installed "
            f"(looked for {found[0] if found else 'the sklearn package'}).",
            "pip install 'torchslurm[train]' (or scikit-learn), or use dataset=synthetic or dataset=mnist.")
    return found[0]


def synthetic(num_samples: int = 4096, shape: Sequence[int] = (10,), num_classes: int = 2,
              val_fraction: float = 0.2, seed: int = 0) -> Split:
    """Gaussian inputs of any `shape`; labels are the argmax of a fixed random projection, so a
    model can learn them (useful for benchmarks and SimpleModel)."""
    if num_samples < 2 or num_classes < 2 or any(int(d) < 1 for d in shape):
        raise ConfigError(
            f"synthetic data with num_samples={num_samples}, shape={tuple(shape)}, "
            f"num_classes={num_classes}: expected num_samples >= 2, num_classes >= 2, positive sizes.",
            "e.g. synthetic(num_samples=4096, shape=(10,), num_classes=2)."
        )
    rng = np.random.default_rng(seed)
    inputs = rng.standard_normal((num_samples, *shape), dtype=np.float32)
    projection = rng.standard_normal((int(np.prod(shape)), num_classes), dtype=np.float32)
    labels = np.argmax(inputs.reshape(num_samples, -1) @ projection, axis=1)
    return _split(inputs, labels, val_fraction, seed)


def _split(inputs: np.ndarray, labels: np.ndarray, val_fraction: float, seed: int) -> Split:
    if not 0.0 < val_fraction < 1.0:
        raise ConfigError(
            f"val_fraction={val_fraction}, expected a fraction strictly between 0 and 1.",
            "val_fraction=0.2 keeps a fifth of the data for validation."
        )
    order = np.random.default_rng(seed).permutation(len(inputs))
    n_val = max(1, round(len(inputs) * val_fraction))
    val, train = order[:n_val], order[n_val:]
    x, y = torch.from_numpy(np.ascontiguousarray(inputs)), torch.from_numpy(labels.astype(np.int64))
    return TensorDataset(x[train], y[train]), TensorDataset(x[val], y[val])


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (optionally gzip-compressed) into a numpy array of its declared shape."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise ConfigError(
            f"{path} is not an IDX file (header {raw[:4].hex() or 'empty'}); expected 00 00 <type> <ndim>.",
            "use the original MNIST files (train-images-idx3-ubyte[.gz], ...), not a converted copy."
        )
    dtype, ndim = np.dtype(_IDX_DTYPES[raw[2]]), raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    expected = 4 + 4 * ndim + int(np.prod(dims)) * dtype.itemsize
    if len(raw) != expected:
        raise ConfigError(
            f"{path} holds {len(raw)} bytes but its header declares shape {dims} ({expected} bytes).",
            "the file is truncated; download it again."
        )
    return np.frombuffer(raw, dtype=dtype, offset=4 + 4 * ndim).reshape(dims)


def write_idx(path: Path, array: np.ndarray) -> None:
    """Write `array` as an IDX file (gzip-compressed when `path` ends in .gz)."""
    kind = f"{array.dtype.kind}{array.dtype.itemsize}"  # e.g. u1, i4, f8
    code = {"u1": 0x08, "i1": 0x09, "i2": 0x0B, "i4": 0x0C, "f4": 0x0D, "f8": 0x0E}.get(kind)
    if code is None:
        raise ConfigError(f"write_idx got dtype {array.dtype}; expected one of uint8, int8, int16, "
                          "int32, float32, float64.",
                          "convert with array.astype(np.uint8).")
    dtype = np.dtype(f">{kind}")  # IDX is big-endian
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    payload = header + np.ascontiguousarray(array, dtype=dtype).tobytes()
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wb") as f:
        f.write(payload)


def _find_mnist(data_dir: Path) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for name in MNIST_FILES:
        for folder in (data_dir, data_dir / "MNIST" / "raw"):  # ours, and torchvision's layout
            for candidate in (folder / name, folder / f"{name}.gz"):
                if name not in found and candidate.is_file():
                    found[name] = candidate
    missing = [f"{name}[.gz]" for name in MNIST_FILES if name not in found]
    if missing:
        raise ConfigError(
            f"data_dir={data_dir}: MNIST files missing: {', '.join(missing)}. Expected the four IDX files "
            f"{', '.join(MNIST_FILES)} (each optionally .gz) in {data_dir} or {data_dir / 'MNIST' / 'raw'}.",
            f"copy them there (torchvision's datasets.MNIST(root='{data_dir}', download=True) on a "
            "machine with network writes them), or use dataset=digits, which needs no files."
        )
    return found


def mnist(data_dir: Path) -> Split:
    """MNIST from the standard IDX files in `data_dir`, normalised with the usual mean/std."""
    files = _find_mnist(Path(data_dir))

    def pair(prefix: str) -> TensorDataset:
        images = read_idx(files[f"{prefix}-images-idx3-ubyte"]).astype(np.float32) / 255.0
        labels = read_idx(files[f"{prefix}-labels-idx1-ubyte"]).astype(np.int64)
        if images.ndim != 3 or len(images) != len(labels):
            raise ConfigError(
                f"{files[f'{prefix}-images-idx3-ubyte']} has shape {images.shape} and its labels "
                f"{labels.shape}; expected (N, H, W) images and N labels.",
                "re-download the files."
            )
        x = torch.from_numpy((images[:, None, :, :] - 0.1307) / 0.3081)
        return TensorDataset(x, torch.from_numpy(labels))

    return pair("train"), pair("t10k")


def image_folder(root: Path, image_size: int = 224) -> Split:
    """`root/train/<class>/*.jpg` and `root/val/<class>/*.jpg` via torchvision's ImageFolder."""
    if importlib.util.find_spec("torchvision") is None:
        raise ConfigError(
            "dataset=imagefolder needs torchvision, which is not installed.",
            "pip install torchvision (the build matching your torch), or use dataset=digits."
        )
    from torchvision import datasets, transforms

    missing = [str(Path(root) / part) for part in ("train", "val") if not (Path(root) / part).is_dir()]
    if missing:
        raise ConfigError(
            f"data_dir={root}: missing {', '.join(missing)}; "
            "expected data_dir/train/<class>/ and data_dir/val/<class>/.",
            "arrange the images as data_dir/train/<class>/img.jpg and data_dir/val/<class>/img.jpg."
        )
    tf = transforms.Compose([transforms.Resize(image_size), transforms.CenterCrop(image_size),
                             transforms.ToTensor()])
    train, val = (datasets.ImageFolder(str(Path(root) / part), tf) for part in ("train", "val"))
    return train, val


def load(name: str, data_dir: Path | None = None, val_fraction: float = 0.2, seed: int = 0) -> Split:
    """The dataset called `name` (one of DATASETS)."""
    if name == "digits":
        return digits(val_fraction, seed)
    if name == "synthetic":
        return synthetic(val_fraction=val_fraction, seed=seed)
    if name == "text":
        from torchslurm.train.text import stdlib_text

        return stdlib_text(val_fraction=val_fraction, seed=seed)
    if name in ("mnist", "imagefolder"):
        if data_dir is None:
            raise ConfigError(f"dataset={name} needs data_dir, which is not set.",
                              f"add data_dir=/path/to/{name} (a directory every rank can read).")
        return mnist(data_dir) if name == "mnist" else image_folder(data_dir)
    raise not_one_of("dataset", name, DATASETS, hint="dataset=digits needs no download.")


def limited(split: Split, max_samples: int) -> Split:
    """The first `max_samples` training samples and a quarter as many validation ones (at least one);
    `split` itself for 0."""
    if max_samples <= 0:
        return split
    train, val = split
    return _first(train, max_samples), _first(val, max(1, max_samples // 4))


def _first(dataset: Dataset[Any], n: int) -> Dataset[Any]:
    if isinstance(dataset, TensorDataset):  # still one tensor each: batched indexing stays fast
        return TensorDataset(*(t[:n] for t in dataset.tensors))
    assert isinstance(dataset, Sized)
    return Subset(dataset, range(min(n, len(dataset))))


def describe(dataset: Dataset[Any]) -> tuple[tuple[int, ...], int]:
    """(input shape, number of classes) of a classification dataset from this module."""
    if isinstance(dataset, TensorDataset):
        inputs, labels = dataset.tensors[0], dataset.tensors[1]
        if labels.dim() == 2:  # next-token targets: the classes are the (byte) vocabulary
            from torchslurm.train.text import VOCAB

            return tuple(inputs.shape[1:]), VOCAB
        return tuple(inputs.shape[1:]), int(labels.max()) + 1
    classes = getattr(dataset, "classes", None)  # torchvision's ImageFolder
    if classes is None:
        raise ConfigError(f"cannot tell the classes of a {type(dataset).__name__}.",
                          "give it a `classes` list (as torchvision's ImageFolder has), or build the model yourself.")
    return tuple(dataset[0][0].shape), len(classes)


def batches(dataset: Dataset[Any], sampler: Sampler[int], batch_size: int, **options: Any) -> DataLoader[Any]:
    """`DataLoader(dataset, batch_size, sampler=sampler, **options)`: the same batches, in the same
    order. A TensorDataset is read a batch at a time (`TensorBatches`) rather than a sample at a time,
    unless a `collate_fn` of your own wants the samples."""
    if type(dataset) is TensorDataset and options.get("collate_fn") is None:  # a subclass may have its own __getitem__
        return DataLoader(TensorBatches(dataset), batch_size=None,
                          sampler=BatchSampler(sampler, batch_size, drop_last=False), **options)
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, **options)


def epoch_batches(dataset: Dataset[Any], batch_size: int, rank: int, world_size: int, seed: int, epoch: int,
                  skip: int = 0, **options: Any) -> DataLoader[Any]:
    """`rank`'s training batches of `epoch` after its first `skip` (a resume inside an epoch). Their
    order is a pure function of (seed, epoch): DistributedSampler's permutation, and a generator of
    the loader's own, so that worker seeds come from (seed, epoch) and creating the iterator draws
    nothing from the global torch RNG (which a checkpoint restores for dropout & co)."""
    sampler: DistributedSampler[Any] = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                                          seed=seed)
    sampler.set_epoch(epoch)
    generator = torch.Generator().manual_seed(seed * 100_003 + epoch)
    return batches(dataset, SkipSampler(sampler, skip * batch_size), batch_size, generator=generator, **options)


class TensorBatches(Dataset[tuple[torch.Tensor, ...]]):
    """A TensorDataset indexed by a batch's sample indices: the tensors default collation would
    stack from those samples, taken with one indexing per tensor. With small samples (a 10-feature
    MLP), one __getitem__ per sample plus the stacking was a quarter of a step's time."""

    def __init__(self, dataset: TensorDataset) -> None:
        self.tensors = dataset.tensors

    def __getitem__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:  # type: ignore[override]
        index = torch.as_tensor(indices)
        return tuple(tensor[index] for tensor in self.tensors)

    def __len__(self) -> int:
        return len(self.tensors[0])


class SkipSampler(Sampler[int]):
    """The wrapped sampler's indices after the first `skip` (resume inside an epoch)."""

    def __init__(self, inner: DistributedSampler[Any], skip: int) -> None:
        self.inner, self.skip = inner, skip

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(iter(self.inner), self.skip, None)

    def __len__(self) -> int:
        return max(0, len(self.inner) - self.skip)


class ShardSampler(Sampler[int]):
    """Rank r of W gets indices r, r+W, r+2W, … of the dataset: no padding, no repeats, so
    validation sums over all ranks cover each sample exactly once (DistributedSampler would pad
    by repeating samples and bias the metrics)."""

    def __init__(self, size: int, rank: int, world_size: int) -> None:
        self.indices = range(rank, size, world_size)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)
