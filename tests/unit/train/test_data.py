import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from torchslurm.errors import ConfigError
from torchslurm.train import data


def test_digits_are_sklearns_load_digits_read_without_importing_sklearn() -> None:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    train, val = data.digits(val_fraction=0.2, split_seed=0)
    ours = torch.cat([train.tensors[0], val.tensors[0]])  # type: ignore[attr-defined]
    labels = torch.cat([train.tensors[1], val.tensors[1]])  # type: ignore[attr-defined]
    order = np.random.default_rng(0).permutation(len(bunch.target))
    order = np.concatenate([order[len(val):], order[:len(val)]])  # train first, as concatenated above
    images = np.asarray(bunch.images, dtype=np.float32) / 16.0
    expected = torch.from_numpy((images - images.mean()) / images.std())[order]
    assert torch.equal(ours[:, 0], expected)
    assert torch.equal(labels, torch.from_numpy(bunch.target.astype(np.int64))[order])


def test_digits_without_scikit_learn_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match="scikit-learn is not installed") as info:
        data.digits()
    assert "dataset=synthetic" in (info.value.hint or "")


def test_digits_split_is_deterministic_and_disjoint() -> None:
    train, val = data.digits(val_fraction=0.2, split_seed=0)
    assert (len(train), len(val)) == (1438, 359)
    x, y = train[0]
    assert x.shape == (1, 8, 8) and x.dtype == torch.float32 and y.dtype == torch.int64
    again, _ = data.digits(val_fraction=0.2, split_seed=0)
    assert torch.equal(train.tensors[0], again.tensors[0])  # type: ignore[attr-defined]


@pytest.mark.parametrize("suffix", ["", ".gz"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int32, np.float64])
def test_idx_roundtrip(tmp_path: Path, suffix: str, dtype: type) -> None:
    array = (np.arange(60) % 200).astype(dtype).reshape(3, 4, 5)
    data.write_idx(tmp_path / f"a{suffix}", array)
    assert np.array_equal(data.read_idx(tmp_path / f"a{suffix}"), array)


def test_idx_reader_reads_the_reference_header_bytes(tmp_path: Path) -> None:
    # Written by hand from the format description: magic 00 00 08 01, one dim of size 3.
    (tmp_path / "labels").write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 2, 1]))
    assert data.read_idx(tmp_path / "labels").tolist() == [7, 2, 1]


def test_truncated_idx_is_reported(tmp_path: Path) -> None:
    (tmp_path / "bad").write_bytes(bytes([0, 0, 8, 1, 0, 0, 0, 9, 1, 2]))
    with pytest.raises(ConfigError, match=r"holds 10 bytes but its header declares shape \(9,\).*HINT"):
        data.read_idx(tmp_path / "bad")


def _write_mnist(folder: Path, n_train: int = 6, n_test: int = 4, gz: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    sfx = ".gz" if gz else ""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), np.uint8)
        data.write_idx(folder / f"{prefix}-images-idx3-ubyte{sfx}", images)
        data.write_idx(folder / f"{prefix}-labels-idx1-ubyte{sfx}", np.arange(n, dtype=np.uint8) % 10)


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_reads_idx_files(tmp_path: Path, gz: bool) -> None:
    _write_mnist(tmp_path, gz=gz)
    train, test = data.mnist(tmp_path)
    assert (len(train), len(test)) == (6, 4)
    x, y = train[3]
    assert x.shape == (1, 28, 28) and int(y) == 3


def test_mnist_accepts_torchvision_layout(tmp_path: Path) -> None:
    _write_mnist(tmp_path / "MNIST" / "raw", gz=True)
    assert len(data.mnist(tmp_path)[0]) == 6
    with gzip.open(tmp_path / "MNIST" / "raw" / "train-labels-idx1-ubyte.gz") as f:
        assert f.read(4) == bytes([0, 0, 8, 1])


def test_missing_mnist_names_files_and_place(tmp_path: Path) -> None:
    _write_mnist(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(ConfigError, match=rf"data_dir={tmp_path}: MNIST files missing: "
                       r"t10k-labels-idx1-ubyte\[\.gz\]\. .* in .*MNIST/raw.*HINT: copy them there"):
        data.mnist(tmp_path)


def test_synthetic_any_shape_is_learnable_labels() -> None:
    train, val = data.synthetic(num_samples=100, shape=(3, 4, 4), num_classes=5, seed=1)
    assert len(train) + len(val) == 100
    assert train[0][0].shape == (3, 4, 4)
    labels = torch.cat([train.tensors[1], val.tensors[1]])  # type: ignore[attr-defined]
    assert set(labels.tolist()) <= set(range(5)) and len(set(labels.tolist())) > 1


def test_imagefolder_without_torchvision_says_how_to_install(tmp_path: Path) -> None:
    try:
        import torchvision  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match=r"needs torchvision, which is not installed\. HINT: pip"):
            data.image_folder(tmp_path)
    else:
        pytest.skip("torchvision is installed")


def test_unknown_dataset_lists_choices() -> None:
    with pytest.raises(ConfigError,
                       match=r"^dataset='cifar' is not one of digits, mnist, synthetic, imagefolder, text\."):
        data.load("cifar")


def test_bad_val_fraction() -> None:
    with pytest.raises(ConfigError, match=r"val_fraction=1.5, expected a fraction strictly between 0 and 1"):
        data.digits(val_fraction=1.5)


@pytest.mark.parametrize(("size", "world"), [(359, 2), (359, 3), (2, 3), (10, 1)])
def test_shards_cover_every_sample_exactly_once(size: int, world: int) -> None:
    shards = [list(data.ShardSampler(size, rank, world)) for rank in range(world)]
    assert sorted(i for shard in shards for i in shard) == list(range(size))
    assert [len(data.ShardSampler(size, rank, world)) for rank in range(world)] == [len(s) for s in shards]


def test_skip_sampler_resumes_the_same_order() -> None:
    dataset = torch.utils.data.TensorDataset(torch.arange(50))
    full = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=1, shuffle=True, seed=7)
    full.set_epoch(3)
    skipped = data.SkipSampler(full, 8)
    assert list(skipped) == list(full)[8:] and len(skipped) == 17


@pytest.mark.parametrize("skip", [0, 5])
def test_a_tensor_dataset_is_read_in_the_batches_default_collation_makes(skip: int) -> None:
    """Batched indexing of a TensorDataset gives exactly the batches (order, values, dtypes, shapes,
    a short last one) that DataLoader's per-sample reading and stacking gives."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    generator = torch.Generator().manual_seed(0)
    dataset = TensorDataset(torch.randn(37, 1, 4, 4, generator=generator), torch.randint(0, 10, (37,)),
                            torch.arange(37, dtype=torch.float64))

    def sampler() -> data.SkipSampler:
        inner: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
            dataset, num_replicas=2, rank=1, shuffle=True, seed=3)
        inner.set_epoch(2)
        return data.SkipSampler(inner, skip)

    fast = data.batches(dataset, sampler(), 4)
    assert isinstance(fast.dataset, data.TensorBatches)
    plain = DataLoader(dataset, batch_size=4, sampler=sampler())
    assert len(fast) == len(plain) == -(-(19 - skip) // 4)
    for got, expected in zip(fast, plain, strict=True):
        assert [(t.dtype, t.shape) for t in got] == [(t.dtype, t.shape) for t in expected]
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_batches_read_by_a_worker_process_are_the_same() -> None:
    from torch.utils.data import TensorDataset

    dataset = TensorDataset(torch.arange(10.0).reshape(5, 2), torch.arange(5))
    here = list(data.batches(dataset, data.ShardSampler(5, 0, 1), 2))
    worker = list(data.batches(dataset, data.ShardSampler(5, 0, 1), 2, num_workers=1))
    assert [len(b[0]) for b in worker] == [2, 2, 1]
    assert all(torch.equal(a, b) for x, y in zip(here, worker, strict=True) for a, b in zip(x, y, strict=True))


def test_other_datasets_are_read_a_sample_at_a_time() -> None:
    from torch.utils.data import TensorDataset

    class Doubled(TensorDataset):
        def __getitem__(self, index: int) -> tuple[torch.Tensor, ...]:
            return tuple(2 * t for t in super().__getitem__(index))  # type: ignore[no-untyped-call]

    dataset = Doubled(torch.arange(6.0))
    loader = data.batches(dataset, data.ShardSampler(6, 0, 1), 4)
    assert loader.dataset is dataset
    assert [batch[0].tolist() for batch in loader] == [[0.0, 2.0, 4.0, 6.0], [8.0, 10.0]]


def test_max_samples_keeps_the_first_samples_and_a_quarter_as_many_for_validation() -> None:
    import torch
    from torch.utils.data import Subset, TensorDataset

    from torchslurm.train.data import limited

    train = TensorDataset(torch.arange(100), torch.arange(100) * 2)
    val = TensorDataset(torch.arange(40))
    short_train, short_val = limited((train, val), 20)
    assert isinstance(short_train, TensorDataset) and len(short_train) == 20  # still whole tensors: fast batches
    assert torch.equal(short_train.tensors[1], torch.arange(20) * 2)
    assert len(short_val) == 5
    assert limited((train, val), 0) == (train, val)
    assert len(limited((train, val), 2)[1]) == 1  # never an empty validation set
    listed = limited((list(range(10)), list(range(8))), 4)  # any other dataset: a Subset of its first samples
    assert isinstance(listed[0], Subset) and list(listed[0]) == [0, 1, 2, 3] and list(listed[1]) == [0]
