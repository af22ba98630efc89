"""The datasets in data/ are the brief's, and the helpers load them."""

from __future__ import annotations

import importlib.util
import json

import torch

from attention_course import data
from tests.nbtools import ROOT


def test_milk_is_exactly_the_seeded_draw():
    spec = importlib.util.spec_from_file_location("make_milk", ROOT / "data" / "make_milk.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert json.loads((ROOT / "data" / "milk.json").read_text()) == module.draw()


def test_love_cats_shapes_and_numbers():
    ex = data.love_cats()
    assert ex.tokens == ["I", "love", "cats"]
    assert ex.X.shape == (3, 4) and ex.W_q.shape == (4, 3) and ex.W_v.shape == (4, 3)
    assert ex.X.dtype == torch.float32
    assert torch.equal(ex.X @ ex.W_q, torch.tensor([[1.0, 0, 2], [2, 2, 2], [2, 1, 3]]))


def test_cat_sat_has_readable_features():
    ex = data.cat_sat()
    assert ex.tokens == ["The", "cat", "sat", "on", "the"]
    assert ex.features == ["thing", "action", "small word", "first token"]
    assert ex.X.shape == (5, 4)
    # W_q maps "small word" onto query dim 0; W_k maps "thing" onto key dim 0
    assert ex.W_q[2, 0] > 0 and ex.W_k[0, 0] > 0


def test_colours():
    d = data.colours()
    assert d.keys["orange"] == [0.8, 0.6] and d.values["orange"] == [255.0, 165.0]
    assert d.query == [1.0, 0.1] and d.sharpness == [1.0, 5.0, 25.0]


def test_data_dir_can_be_overridden(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTENTION_COURSE_DATA", str(tmp_path))
    (tmp_path / "love_cats.json").write_text((ROOT / "data" / "love_cats.json").read_text())
    assert data.data_dir() == tmp_path
