import json
import shutil
import pytest

from gdnbench.data import shapes as shp

GOOD = """
name = "t"
version = 1
hash = ""
[defaults]
family = "gdn"
K = 32
V = 32
[[shape]]
id = "a"
H = 2
HV = 4
lens = [10, 20]
seed = 1
"""


def write(tmp_path, text, name="t.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_shipped_sets_parse_and_verify():
    ledger = shp.load_ledger()
    names = set(shp.available())
    assert {"kda-legacy6", "gdn-qwen6", "models", "smoke"} <= names
    for name in names:
        ss = shp.load(name)
        assert shp.verify(ss, ledger) == [], name


def test_contract_sets_content():
    kda = shp.load("kda-legacy6")
    assert [s.id for s in kda.shapes] == ["h96_fixed", "h96_mixed", "h96_uniform", "h64_fixed", "h64_mixed",
                                          "h64_uniform"]
    assert [s.seed for s in kda.shapes] == list(range(10000, 10006))
    for s in kda.shapes:
        assert (s.K, s.V, s.tokens, s.dtype, s.lower_bound, s.family) == (128, 128, 8192, "bfloat16", -5.0, "kda")
        assert s.attn_scale == pytest.approx(128 ** -0.5)
    assert kda.get("h96_mixed").lens == (1300, 547, 2048, 963, 271, 3063)
    gdn = shp.load("gdn-qwen6")
    assert [(s.H, s.HV, s.tokens) for s in gdn.shapes] == [(16, 32, 8192), (16, 64, 8192), (4, 8, 8192),
                                                           (16, 48, 8192), (16, 32, 32768), (2, 8, 8192)]
    assert gdn.get("h2_hv8_serving").initial_state and gdn.get("h2_hv8_serving").varlen


def test_defaults_layering_and_hash_is_semantic(tmp_path):
    a = shp.load_file(write(tmp_path, GOOD))
    assert a.shapes[0].HV == 4 and a.shapes[0].gate == "logsigmoid" and a.shapes[0].varlen
    reformatted = GOOD.replace("K = 32\nV = 32\n", "").replace('id = "a"', 'id = "a"\nK = 32\nV = 32')
    b = shp.load_file(write(tmp_path, reformatted, "u.toml"))
    assert shp.canonical_hash(a.name, a.version, a.shapes) == shp.canonical_hash(b.name, b.version, b.shapes)


def test_changed_set_fails_verify_until_version_bump(tmp_path):
    d = tmp_path / "shapes"
    d.mkdir()
    src = shp.available()["smoke"]
    p = d / "smoke.toml"
    shutil.copy(src, p)
    (d / shp.FROZEN_LEDGER).write_text(json.dumps(shp.load_ledger()))
    assert shp.verify(shp.load_file(p), shp.load_ledger(d)) == []
    p.write_text(p.read_text().replace("seed = 1\n", "seed = 99\n"))
    problems = shp.verify(shp.load_file(p), shp.load_ledger(d))
    assert any("differs from the frozen hash" in x for x in problems)
    with pytest.raises(shp.ShapeError, match="bump 'version'"):
        shp.freeze(p, d)  # same version, new content: refused
    p.write_text(p.read_text().replace("version = 1", "version = 2"))
    shp.freeze(p, d)
    assert shp.verify(shp.load_file(p), shp.load_ledger(d)) == []
    assert set(shp.load_ledger(d)["smoke"]) == {"1", "2"}


@pytest.mark.parametrize("hash_line", ["", "hash = 'to be filled'\n"])
def test_freeze_writes_a_hash_where_the_file_has_none(tmp_path, hash_line):
    p = write(tmp_path, GOOD.replace('hash = ""\n', hash_line))
    if not hash_line:
        with pytest.raises(shp.ShapeError, match="'hash': missing"):
            shp.load_file(p)
    h = shp.freeze(p, tmp_path)
    ss = shp.load_file(p)
    assert ss.hash == h and p.read_text().count("hash =") == 1
    assert shp.verify(ss, shp.load_ledger(tmp_path)) == []


@pytest.mark.parametrize("edit, field, words", [
    (("HV = 4", "HV = 3"), "HV", "not a multiple of H=2"),
    (("lens = [10, 20]", "lens = [10, -5]"), "lens", "not positive"),
    (("lens = [10, 20]", "lens = []"), "lens", "empty"),
    (("K = 32", "K = 512"), "K", "over 256"),
    (("seed = 1", "seed = 1\ncolour = 3"), "colour", "unknown key"),
    (("H = 2", 'H = "2"'), "H", "expected int"),
    (("H = 2", "H = true"), "H", "got bool"),
    (("seed = 1", 'seed = 1\ngate_regime = "weak"'), "gate_regime", "not one of ('strong', 'long')"),
    (("seed = 1", "seed = 1\ngate_regime = 1"), "gate_regime", "expected str"),
])
def test_bad_files_name_file_shape_and_field(tmp_path, edit, field, words):
    p = write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(shp.ShapeError) as e:
        shp.load_file(p)
    msg = str(e.value)
    assert str(p) in msg and "'a'" in msg and f"field {field!r}" in msg and words in msg
    assert "\n" not in msg


def test_kda_needs_lower_bound(tmp_path):
    p = write(tmp_path, GOOD.replace('family = "gdn"', 'family = "kda"'))
    with pytest.raises(shp.ShapeError, match="lower_bound"):
        shp.load_file(p)


def test_shortened_keeps_the_mix():
    s = shp.load("kda-legacy6").get("h96_mixed")
    short = s.shortened(1024)
    assert len(short.lens) == len(s.lens) and short.tokens <= 1030 and short.H == s.H
    assert short.lens[2] > short.lens[4]  # 2048 stays longer than 271
    assert s.shortened(10 ** 6) is s


# the hashes every result so far was measured under: a new format field must leave them as they are
CONTRACT_HASHES = {
    "gdn-qwen6": "sha256:050a6dae04f02f349e7e2044cd579faf9a4fff011dcae81c3f16c489b82bd575",
    "kda-legacy6": "sha256:34c2c02dec5e309e8855fb13e0226645b91e93778097a8f330784d1398bfbeb0",
    "smoke": "sha256:7fd1c6ecb34a6527aaa05d6cbb04718b78d7fa3d3ce9c442f837de02f067bff4",
    "gdn-decode": "sha256:1ff02b036769b17aa880c1c44a3c447d8b0f82bd707d017c87a0cc39469c7033",
}


@pytest.mark.parametrize("name", sorted(CONTRACT_HASHES))
def test_existing_sets_keep_their_hashes(name):
    ss = shp.load(name)
    assert all(s.gate_regime == "strong" for s in ss.shapes)
    assert shp.canonical_hash(ss.name, ss.version, ss.shapes) == CONTRACT_HASHES[name] == ss.hash


def test_gate_regime_enters_the_hash_only_away_from_strong(tmp_path):
    a = shp.load_file(write(tmp_path, GOOD))
    strong = shp.load_file(write(tmp_path, GOOD.replace("seed = 1", 'seed = 1\ngate_regime = "strong"'), "s.toml"))
    long = shp.load_file(write(tmp_path, GOOD.replace("seed = 1", 'seed = 1\ngate_regime = "long"'), "l.toml"))
    assert long.shapes[0].gate_regime == "long" and a.shapes[0].gate_regime == "strong"
    h = [shp.canonical_hash(x.name, x.version, x.shapes) for x in (a, strong, long)]
    assert h[0] == h[1] != h[2]


@pytest.mark.parametrize("strong_name", ["gdn-qwen6", "kda-legacy6"])
def test_long_sets_are_the_contract_sets_in_the_long_regime(strong_name):
    strong, long = shp.load(strong_name), shp.load(strong_name + "-long")
    assert long.name == strong_name + "-long" and long.version == 1
    assert [s.id for s in long.shapes] == [s.id + "_long" for s in strong.shapes]
    for s, l in zip(strong.shapes, long.shapes):
        assert l.gate_regime == "long" and s.gate_regime == "strong"
        assert l.label() == s.label() + " long-g"
        assert shp._replace(l, id=s.id, gate_regime="strong") == s
