"""Data larger than memory: LitData's chunked format, streamed from a folder or an object store.

Convert any kiln datamodule (image folders, a Hugging Face dataset, tensors) once::

    kiln convert -c configs/data/folder.yaml --data.init_args.root data/images --output data/streamed

then train with ``-c configs/data/streaming.yaml --data.init_args.root data/streamed``.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from kiln.data.base import TensorDataModule
from kiln.data.datasets import SampleDataset
from kiln.data.on_device import augmentation_seed, normalised, seeded_augmentation, stats_view, to_unit_float
from kiln.errors import ConfigError, DataError
from kiln.training.contracts import project_declarations

META = "kiln.json"  # what the data declares (classes, shape, statistics), written next to the chunks
SIZES = ("num_outputs", "vocab_size", "block_size")  # other declarations the model's links read (README's table)


def sizes() -> tuple[str, ...]:
    """The declarations beside classes and shape that ``kiln.json`` keeps: kiln's and the project's own."""
    return project_declarations(SIZES)


SPLITS = ("train", "val", "test")


def _sample(dataset: SampleDataset, index: int) -> dict[str, Any]:
    x, y = dataset.raw(index)
    return {"x": x, "y": y}


def convert(data: TensorDataModule, output: str | Path, chunk_bytes: str = "64MB", num_workers: int = 1) -> Path:
    """Write each split of ``data`` (raw samples: uint8 images stay uint8) as LitData chunks, plus ``kiln.json``."""
    import litdata  # an optional dependency (the `data` extra)

    output = Path(output)
    data.setup("fit")
    for split in SPLITS:
        dataset = getattr(data, f"{split}_set")
        if dataset is None or len(dataset) == 0:
            continue
        litdata.optimize(fn=partial(_sample, dataset), inputs=list(range(len(dataset))), output_dir=str(output / split),
                         chunk_bytes=chunk_bytes, num_workers=num_workers, mode="overwrite", verbose=False,
                         start_method="fork" if sys.platform == "linux" else None)  # fmt: skip
    meta = {
        "num_classes": data.num_classes,
        "input_shape": list(data.input_shape),
        "class_names": list(data.class_names) if data.class_names else None,
        "mean": list(data.mean),
        "std": list(data.std),
        "source": type(data).__name__,
        **{name: getattr(data, name) for name in sizes() if getattr(data, name, None) is not None},
    }
    (output / META).write_text(json.dumps(meta, indent=2))
    return output


def _streaming_dataset() -> type:
    """``StreamingDataset`` that augments (seeded by run seed, epoch and sample) and normalises each sample."""
    from litdata import StreamingDataset

    class KilnStreamingDataset(StreamingDataset):
        def __init__(self, input_dir: str, normalise: tuple[Tensor, Tensor], augment: Any, seed: int, **kwargs):
            super().__init__(input_dir, seed=seed, **kwargs)
            self.normalise, self.augment, self.kiln_seed = normalise, augment, seed  # (`transform` is LitData's)

        def __getitem__(self, index: Any) -> tuple[Tensor, Tensor]:
            item = super().__getitem__(index)
            x = to_unit_float(torch.as_tensor(item["x"]))  # integer inputs (token ids) as they are
            if self.augment is not None and torch.is_floating_point(x):
                position = int(getattr(index, "index", index))
                seed = augmentation_seed(self.kiln_seed, self.current_epoch, position)
                with seeded_augmentation(seed), torch.inference_mode():
                    x = self.augment(x)
            return normalised(x, *self.normalise), torch.as_tensor(item["y"])  # targets keep their dtype

    return KilnStreamingDataset


def _streaming_loader() -> type:
    """``StreamingDataLoader`` whose loaded state applies to the next pass only.

    LitData keeps a loaded state for every later pass until one runs to its end, so with
    ``limit_train_batches`` (every epoch cut short) a resumed run would replay the checkpoint's
    epoch position in each later epoch.
    """
    from litdata import StreamingDataLoader

    class KilnStreamingDataLoader(StreamingDataLoader):
        just_loaded = False

        def load_state_dict(self, obj: dict[str, Any]) -> None:
            super().load_state_dict(obj)
            self.just_loaded = True

        def __iter__(self) -> Any:
            if not self.just_loaded:
                self.restore = False  # a new epoch, whether or not the last pass ran to its end
            self.just_loaded = False
            return super().__iter__()

    return KilnStreamingDataLoader


class StreamingDataModule(TensorDataModule):
    """Streams the chunks :func:`convert` wrote, from a local folder or an object-store URL.

    Shards across DDP ranks and DataLoader workers by itself, shuffles by (seed, epoch), and
    resumes mid-epoch from the loader's own state (``StreamingDataLoader.state_dict``), kept in the
    checkpoint as this datamodule's state: what a preempted cluster job needs. (Lightning's own
    loader-state restore comes too late here: ``estimated_stepping_batches``, which sizes the
    learning-rate schedule, builds the loader before the loops' state is restored.)

    Args:
        root: The folder (or ``s3://``/``gs://`` URL) holding ``train/``, ``val/``, ``test/``.
        meta: The ``kiln.json`` the conversion wrote; ``None`` reads it from ``root`` (a local folder).
        cache_dir: Where chunks from a URL are cached locally; ``None``: LitData's default.
        **kwargs: Loader and transform options of :class:`TensorDataModule` (``on_device`` excepted).
    """

    def __init__(self, root: str, meta: str | None = None, cache_dir: str | None = None, **kwargs) -> None:
        if kwargs.get("on_device"):
            raise ConfigError(
                "data.on_device: streamed data is read in chunks, not held in memory; use on_device=false"
            )
        meta_path = Path(meta) if meta is not None else Path(root) / META
        if not meta_path.is_file():
            raise DataError(f"data: no {META} at {meta_path}; write it with `kiln convert` (or pass meta)")
        declared = json.loads(meta_path.read_text())
        self.default_mean, self.default_std = tuple(declared["mean"]), tuple(declared["std"])  # the converted data's
        super().__init__(**kwargs)
        self.root, self.cache_dir = root.rstrip("/"), cache_dir
        self.num_classes = int(declared["num_classes"]) if declared.get("num_classes") is not None else None
        self.input_shape = tuple(declared["input_shape"])
        self.class_names = tuple(declared["class_names"]) if declared.get("class_names") else None
        self._outputs = declared.get("num_outputs", self.num_classes)  # a kiln.json without it: a logit per class
        for name in sizes()[1:]:
            if declared.get(name) is not None:
                setattr(self, name, int(declared[name]))
        self._train_loader: Any = None
        self._pending: dict[str, Any] | None = None  # a checkpoint's loader state, for the next training loader

    @property
    def num_outputs(self) -> int | None:
        """What the converted data declared a network gives per sample."""
        return self._outputs

    def state_dict(self) -> dict[str, Any]:
        return {"loader": self._train_loader.state_dict()} if self._train_loader is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict.get("loader")

    def load(self) -> None:
        streaming = _streaming_dataset()
        normalise = (stats_view(self.mean, self.input_shape, "mean"), stats_view(self.std, self.input_shape, "std"))
        for split in SPLITS:
            train = split == "train"
            dataset = streaming(f"{self.root}/{split}", normalise, self.train_transform() if train else None,
                                self.seed, shuffle=train, cache_dir=self.cache_dir)  # fmt: skip
            setattr(self, f"{split}_set", dataset)

    def _new_loader(self, dataset: Any, train: bool) -> Any:
        loader = _streaming_loader()(
            dataset,
            batch_size=self.batch_size if train else self.eval_batch_size,
            num_workers=self.num_workers,
            persistent_workers=False,  # LitData sets each pass's epoch in new workers: persistent ones repeat epoch 1
            generator=torch.Generator().manual_seed(self.seed),  # its base seed never drawn from the global RNG
        )
        if train:
            self._train_loader = loader
            if self._pending is not None:  # continue mid-epoch where the checkpoint was saved
                loader.load_state_dict(self._pending)
                self._pending = None
        return loader
