"""The one key of the tuning caches: its text round-trips, the shipped winners' keys are its on-disk form,
and what a key says about an older one (same search, stale part) is what the look-ups act on."""

import json

import pytest

from gdnbench.data import shapes as shp
from gdnbench.kernels import cache_key as ck
from gdnbench.paths import SHIPPED_TUNED_DIR

ENV = {"gpu": "NVIDIA H200", "compute_capability": "9.0", "triton": "3.6.0"}


def test_shape_key_text_parses_back_to_the_same_key():
    for s in shp.load("gdn-qwen6").shapes + shp.load("kda-legacy6").shapes + shp.load("smoke").shapes:
        key = ck.ShapeKey.of(s)
        assert ck.ShapeKey.parse(key.text) == key and ck.shape_key(s) == key.text
    assert ck.ShapeKey.parse("w0_s1") is None and ck.ShapeKey.parse(None) is None


def test_shipped_winners_keep_their_on_disk_key():
    paths = sorted(SHIPPED_TUNED_DIR.glob("*/*.json"))
    assert paths
    for path in paths:
        for e in json.loads(path.read_text())["entries"]:
            key = ck.CacheKey.from_dict(e["key"])
            assert key.as_dict() == e["key"]  # same fields, same order: the files' text is the key's
            assert ck.ShapeKey.parse(key.shape_key).text == key.shape_key


def test_every_shipped_winner_matches_its_kernel_source():
    """A kernel edit makes the entries of the kernels it reaches stale, and gdnbench run ignores them: carry them
    with ``python -m gdnbench.autotune.rekey`` or search again (stale kda16_prep entries once took KDA's flag
    forward at h96_fixed from 1392 to 2181 us)."""
    stale = [f"{path.parent.name}/{e['kernel']} [{e['key']['variant']}] {e['key']['shape_key']}"
             for path in sorted(SHIPPED_TUNED_DIR.glob("*/*.json"))
             for e in json.loads(path.read_text())["entries"]
             if e["key"]["source_hash"] != ck.source_hash(e["kernel"])]
    assert not stale, stale


def test_a_key_tells_an_older_entry_of_the_same_search_from_another_search():
    s = shp.load("gdn-qwen6").shapes[0]
    want = ck.CacheKey.of(ENV, "state", s, "plain")
    assert want.as_dict() == ck.entry_key(ENV, "state", s, "plain") and want.source_hash == ck.source_hash("state")
    older = ck.CacheKey.from_dict({**want.as_dict(), "source_hash": "sha256:old"})
    assert want.stale_part(older) == "source hash" and older.identity() == want.identity()
    newer_triton = ck.CacheKey.from_dict({**want.as_dict(), "triton": "3.5.1"})
    assert want.stale_part(newer_triton) == "Triton version" and newer_triton.identity() != want.identity()
    assert want.stale_part(want) is None
    assert want.stale_part(ck.CacheKey.from_dict({**want.as_dict(), "gpu": "NVIDIA B200"})) is None
    assert want.stale_part(ck.CacheKey.from_dict({**want.as_dict(), "variant": "fuse_k"})) is None


@pytest.mark.parametrize("env", [ENV, {"gpu": {"name": "NVIDIA H200", "compute_capability": "9.0"},
                                      "versions": {"triton": "3.6.0"}}])
def test_machine_reads_a_device_env_or_a_results_env(env):
    assert ck.Machine.of(env) == ck.Machine("NVIDIA H200", "9.0", "3.6.0")


def test_same_heads_is_family_head_sizes_and_dtype():
    a, b = (ck.ShapeKey.of(s) for s in shp.load("gdn-qwen6").shapes[:2])
    assert a.same_heads(b) and not a.same_heads(ck.ShapeKey.of(shp.load("kda-legacy6").shapes[0]))
    assert not a.same_heads(None)
