"""Gaussian blobs: `classes` clusters of points in `dimension` dimensions, one per class, with
centres drawn on a sphere of radius `separation` and unit-variance noise. A dataset generated
from its parameters and seed (no files), small enough for tests, and with a difficulty that is
set by one number (`separation`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cflpipe.data import Dataset, DatasetInfo


class BlobsParams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)
    classes: int = Field(4, ge=2, le=1000, description="number of classes (one blob each)")
    dimension: int = Field(16, ge=1, le=10_000, description="features per sample")
    samples: int = Field(1000, ge=10, le=10_000_000, description="samples in all (train + test)")
    separation: float = Field(3.0, gt=0, description="distance of the blob centres from the origin")
    test_fraction: float = Field(0.2, gt=0, lt=1, description="share held out as the test split")
    seed: int = Field(0, ge=0, description="generator seed (part of the dataset, not of a run)")


def load_blobs(params: BlobsParams, data_dir: Path) -> Dataset:
    rng = np.random.default_rng(params.seed)
    centres = rng.standard_normal((params.classes, params.dimension))
    centres *= params.separation / np.linalg.norm(centres, axis=1, keepdims=True)
    y = rng.integers(0, params.classes, size=params.samples).astype(np.int64)
    x = (centres[y] + rng.standard_normal((params.samples, params.dimension))).astype(np.float32)
    n_test = max(1, int(round(params.samples * params.test_fraction)))
    return Dataset("blobs", x[n_test:], y[n_test:], x[:n_test], y[:n_test], num_classes=params.classes)


BLOBS = DatasetInfo(name="blobs", description="Gaussian blobs, one per class (generated, no files)", load=load_blobs,
                    params=BlobsParams, images=False)
