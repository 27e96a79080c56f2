"""Roofline model (bytes, FLOPs, floor, tables) and calibration files, on the CPU."""

import json
import math

import pytest
import torch

from gdnbench.analysis import calibrate
from gdnbench.oracle import reference
from gdnbench.data import results
from gdnbench.data.records import Row, RunDocument
from gdnbench.analysis import roofline as rf
from gdnbench.analysis.report import Table, to_markdown
from gdnbench.data.shapes import Shape, ShapeSet

TINY = Shape(id="tiny", family="gdn", H=2, HV=4, K=8, V=16, lens=(100, 30), seed=1, gate="logsigmoid",
             initial_state=True)


# ----------------------------------------------------------------------------- bytes
def test_bytes_of_a_tiny_shape_by_hand():
    # T = 130 tokens, N = 2, bf16 (2 bytes)
    b = rf.bytes_breakdown(TINY, "fused_qk")
    assert b == {
        "q": 130 * 2 * 8 * 2,  # 4160
        "k": 130 * 2 * 8 * 2,
        "v": 130 * 4 * 16 * 2,  # 16640
        "g": 130 * 4 * 4,  # fp32 per token and value head: 2080
        "beta": 130 * 4 * 2,  # 1040
        "h0": 2 * 4 * 8 * 16 * 4,  # 4096
        "o": 130 * 4 * 16 * 2,
        "ht": 2 * 4 * 8 * 16 * 4,
    }
    assert rf.bytes_floor(TINY, "fused_qk") == 4160 * 2 + 16640 * 2 + 2080 + 1040 + 4096 * 2
    kda = Shape(id="k", family="kda", H=4, HV=4, K=8, V=16, lens=(130,), seed=1, gate="bounded", lower_bound=-5.0,
                dtype="float32")
    kb = rf.bytes_breakdown(kda, "fused_qk")
    assert kb["g"] == 130 * 4 * 8 * 4 and kb["q"] == 130 * 4 * 8 * 4 and kb["h0"] == 0 and kb["ht"] == 4 * 8 * 16 * 4


def test_route_dependence_of_bytes():
    qk = rf.bytes_floor(TINY, "fused_qk")
    q = rf.bytes_floor(TINY, "fused_q")
    flag = rf.bytes_floor(TINY, "flag")
    one_pass = 2 * 130 * 2 * 8 * 2  # read q (or k) and write its normalized copy
    assert qk < q < flag
    assert q - qk == one_pass and flag - q == one_pass
    assert rf.bytes_floor(TINY, "explicit") == flag
    assert rf.bytes_floor(TINY, "none") == qk
    with pytest.raises(rf.RooflineError, match="route 'bogus'"):
        rf.bytes_floor(TINY, "bogus")


# ----------------------------------------------------------------------------- FLOPs
def test_chunk_lens():
    assert rf.chunk_lens(TINY) == [64, 36, 30]
    assert rf.chunk_lens(Shape(id="b", family="gdn", H=1, HV=1, K=4, V=4, lens=(128,), seed=0, gate="logsigmoid",
                               B=3)) == [64, 64] * 3


def test_flops_of_one_chunk_by_hand():
    # c = 4, K = 2, V = 3
    f = rf.chunk_flops(4, 2, 3)
    assert f["gram"] == 2 * (2 * 6)  # 6 strictly-lower pairs, K = 2 multiply-adds each
    assert f["solve"] == 2 * (3 * 1 + 2 * 2 + 1 * 3)  # sum over i > j of (i - j) multiply-adds = 10 -> 20
    assert f["wu"] == 2 * 10 * (2 + 3)  # 10 lower-incl-diagonal entries, K + V columns
    assert f["state"] == 2 * 2 * (4 * 2 * 3)  # w h and k^T v_new
    assert f["output"] == 2 * (4 * 2 * 3) + 2 * 10 * 2 + 2 * 10 * 3  # q h, q k^T, A v_new
    # per token of a full chunk at K = V = 128, C = 64 (the figure quoted in the docstring)
    per_token = sum(rf.chunk_flops(64, 128, 128).values()) / 64
    assert per_token == pytest.approx(141013, abs=1)


def _brute_force_chunked(q, k, v, g, beta, h0, lens, HV, H, C):
    """Chunked GDN forward in plain Python loops, counting every multiply-add of a product of
    two data-dependent matrices. Returns (o, final states, multiply-adds)."""
    macs = 0
    K, V = len(k[0][0]), len(v[0][0])
    group = HV // H
    o = [[[0.0] * V for _ in range(HV)] for _ in range(sum(lens))]
    finals = []
    start = 0
    for n, L in enumerate(lens):
        finals.append([])
        for hv in range(HV):
            kh = hv // group
            S = [row[:] for row in h0[n][hv]] if h0 is not None else None
            for c0 in range(start, start + L, C):
                idx = list(range(c0, min(c0 + C, start + L)))
                c = len(idx)
                gc, acc = [], 0.0
                for t in idx:
                    acc += g[t][hv]
                    gc.append(acc)
                kk = [k[t][kh] for t in idx]
                qq = [q[t][kh] for t in idx]
                bb = [beta[t][hv] for t in idx]
                # gram: strictly lower
                Lm = [[0.0] * c for _ in range(c)]
                for i in range(c):
                    for j in range(i):
                        d = 0.0
                        for x in range(K):
                            d += kk[i][x] * kk[j][x]
                            macs += 1
                        Lm[i][j] = bb[i] * math.exp(gc[i] - gc[j]) * d
                # solve: A = (I + L)^-1 by forward substitution
                A = [[1.0 if i == j else 0.0 for j in range(c)] for i in range(c)]
                for i in range(c):
                    for j in range(i):
                        s = 0.0
                        for m in range(j, i):
                            s += Lm[i][m] * A[m][j]
                            macs += 1
                        A[i][j] = -s
                # w = A (beta e^g k), u = A (beta v)
                kb = [[bb[j] * math.exp(gc[j]) * kk[j][x] for x in range(K)] for j in range(c)]
                vb = [[bb[j] * v[idx[j]][hv][y] for y in range(V)] for j in range(c)]
                w = [[0.0] * K for _ in range(c)]
                u = [[0.0] * V for _ in range(c)]
                for i in range(c):
                    for j in range(i + 1):
                        for x in range(K):
                            w[i][x] += A[i][j] * kb[j][x]
                            macs += 1
                        for y in range(V):
                            u[i][y] += A[i][j] * vb[j][y]
                            macs += 1
                # v_new = u - w S (no product with a zero state)
                vn = [row[:] for row in u]
                if S is not None:
                    for i in range(c):
                        for y in range(V):
                            for x in range(K):
                                vn[i][y] -= w[i][x] * S[x][y]
                                macs += 1
                # output: e^g q S + tril(e^(gi-gj) q k^T) v_new
                for i in range(c):
                    out = [0.0] * V
                    if S is not None:
                        for y in range(V):
                            for x in range(K):
                                out[y] += math.exp(gc[i]) * qq[i][x] * S[x][y]
                                macs += 1
                    for j in range(i + 1):
                        d = 0.0
                        for x in range(K):
                            d += qq[i][x] * kk[j][x]
                            macs += 1
                        a = math.exp(gc[i] - gc[j]) * d
                        for y in range(V):
                            out[y] += a * vn[j][y]
                            macs += 1
                    o[idx[i]][hv] = out
                # state: h' = e^g_last h + (e^(g_last - g_j) k_j)^T v_new
                decay = math.exp(gc[-1])
                S = [[decay * S[x][y] if S is not None else 0.0 for y in range(V)] for x in range(K)]
                for j in range(c):
                    kd = [math.exp(gc[-1] - gc[j]) * kk[j][x] for x in range(K)]
                    for x in range(K):
                        for y in range(V):
                            S[x][y] += kd[x] * vn[j][y]
                            macs += 1
            finals[n].append(S)
        start += L
    return o, finals, macs


@pytest.mark.parametrize("initial_state", [True, False])
def test_flop_formula_matches_a_brute_force_count(initial_state):
    C = 4  # a small chunk so that a tiny shape has several chunks, full and partial
    shape = Shape(id="bf", family="gdn", H=1, HV=2, K=3, V=2, lens=(7, 4, 2), seed=0, gate="logsigmoid",
                  initial_state=initial_state, dtype="float32")
    gen = torch.Generator().manual_seed(0)
    T = shape.tokens
    q = torch.randn(1, T, 1, 3, generator=gen, dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(1, T, 1, 3, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(1, T, 2, 2, generator=gen, dtype=torch.float64)
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, 2, generator=gen, dtype=torch.float64))
    beta = torch.sigmoid(torch.randn(1, T, 2, generator=gen, dtype=torch.float64))
    h0 = 0.25 * torch.randn(3, 2, 3, 2, generator=gen, dtype=torch.float64) if initial_state else None
    o, finals, macs = _brute_force_chunked(q[0].tolist(), k[0].tolist(), v[0].tolist(), g[0].tolist(),
                                           beta[0].tolist(), None if h0 is None else h0.tolist(), shape.lens,
                                           HV=2, H=1, C=C)
    # the brute force is the chunked algorithm: it reproduces the token recurrence
    ref_o, ref_s = reference.recurrence(q, k, v, g, beta, scale=1.0, initial_state=h0, cu_seqlens=[0, 7, 11, 13],
                                        normalize=False)
    assert torch.allclose(torch.tensor(o, dtype=torch.float64), ref_o[0], atol=1e-10)
    assert torch.allclose(torch.tensor(finals, dtype=torch.float64), ref_s, atol=1e-10)
    assert rf.flops_chunked(shape, chunk=C) == 2 * macs


def test_flop_variants():
    gdn = Shape(id="g", family="gdn", H=2, HV=6, K=8, V=8, lens=(64,), seed=0, gate="logsigmoid", initial_state=True)
    full = rf.flops_chunked(gdn)
    shared = rf.flops_chunked(gdn, share_key_products=True)
    assert full - shared == (6 - 2) * (8 * 64 * 63 + 8 * 64 * 65)  # K K^T and q k^T per key head only
    assert rf.flops_recurrent(gdn) == 6 * 64 * 6 * 8 * 8
    no_h0 = Shape(**{**gdn.__dict__, "initial_state": False})
    assert full - rf.flops_chunked(no_h0) == 6 * 4 * 64 * 8 * 8  # w h and q h with the zero state
    # the recurrent count is the chunked count's leading term
    big = Shape(id="b", family="gdn", H=16, HV=32, K=128, V=128, lens=(8192,), seed=0, gate="logsigmoid")
    assert 1.3 < rf.flops_chunked(big) / rf.flops_recurrent(big) < 1.5


# ----------------------------------------------------------------------------- floor
def test_floor_picks_the_binding_term():
    nbytes, flops = rf.bytes_floor(TINY, "flag"), rf.flops_chunked(TINY)
    mem_bound = rf.floor_us(TINY, "flag", rf.make_calib(1e9, 1e18))
    assert mem_bound.binding == "memory"
    assert mem_bound.floor_us == pytest.approx(nbytes / 1e9 * 1e6) == pytest.approx(mem_bound.memory_us)
    assert mem_bound.compute_us == pytest.approx(flops / 1e18 * 1e6)
    comp_bound = rf.floor_us(TINY, "flag", rf.make_calib(1e18, 1e9))
    assert comp_bound.binding == "compute" and comp_bound.floor_us == pytest.approx(flops / 1e9 * 1e6)
    assert comp_bound.intensity == pytest.approx(flops / nbytes)
    assert comp_bound.fraction_gpu is None  # a shape alone has no measured time


def test_floor_of_a_row_and_its_fractions():
    calib = rf.make_calib(1e9, 1e18)
    row = Row.from_dict(_row("tiny", "fla", "fused_q", 200.0, 400.0))
    f = rf.floor_us(row, None, calib, shape=TINY)
    assert f.route == "fused_q" and f.backend == "fla"
    assert f.fraction_gpu == pytest.approx(f.floor_us / 200.0)
    assert f.fraction_wall == pytest.approx(f.floor_us / 400.0)
    bad = Row.from_dict(_row("tiny", "fla", "fused_q", status="incorrect"))
    assert rf.floor_us(bad, None, calib, shape=TINY).fraction_gpu is None
    with pytest.raises(rf.RooflineError, match="shape="):
        rf.floor_us(row, None, calib)
    with pytest.raises(rf.RooflineError, match="bandwidth_bytes_per_s"):
        rf.floor_us(TINY, "flag", {"matmul_flops_per_s": 1e12})


def test_h200_sanity_fractions():
    """The numbers measured on our H200 (copy ~4.3 TB/s, bf16 matmul ~790 TFLOP/s) under this model."""
    from gdnbench.data import shapes

    c = rf.H200_FIELD_NOTES
    gdn = shapes.load("gdn-qwen6").get("h16_hv32_fixed8k")
    kda = shapes.load("kda-legacy6").get("h96_fixed")
    f = rf.floor_us(gdn, "explicit", c)
    assert f.binding == "memory" and 0.14 < f.floor_us / 520 < 0.17
    f = rf.floor_us(gdn, "fused_qk", c)
    assert 0.08 < f.floor_us / 520 < 0.10
    f = rf.floor_us(kda, "flag", c)
    assert f.binding == "memory" and 0.17 < f.floor_us / 2600 < 0.19
    f = rf.floor_us(kda, "fused_qk", c)
    assert 0.10 < f.floor_us / 2600 < 0.12


# ----------------------------------------------------------------------------- tables and charts
def _row(shape, backend, route, gpu=None, wall=None, status="ok"):
    r = {"shape_id": shape, "family": "gdn", "backend": backend, "route": route, "mode": "fwd", "status": status,
         "reason": "" if status in ("ok", "incorrect") else "not run"}
    if status in ("ok", "incorrect"):
        r["check"] = {"passed": status == "ok"}
    if status == "ok":
        r["gpu"], r["wall"] = {"median_us": gpu}, {"median_us": wall}
    return r


def _doc(rows, name="no-such-set", labels=None, hash_="sha256:x"):
    return RunDocument.from_dict({
        "schema_version": results.SCHEMA_VERSION, "created_utc": "x", "env": {"device": "cuda",
        "gpu": {"name": "NVIDIA H200"}}, "timing": {}, "run": {}, "rows": rows,
        "shape_set": {"name": name, "version": 1, "hash": hash_,
                      "shapes": labels or {"tiny": TINY.label(), "long": "gdn H16/HV32 K128 V128 T8192"}}})


ROWS = [_row("tiny", "fla", "flag", 20.0, 50.0), _row("tiny", "gdnbench", "fused_qk", 10.0, 12.0),
        _row("tiny", "gdnbench", "fused_q", status="incorrect"), _row("tiny", "helion", "flag", status="skipped"),
        _row("long", "fla", "explicit", 520.0, 1000.0), _row("long", "fla", "flag", 521.0, 900.0),
        _row("long", "fla", "fused_qk", status="skipped")]


def test_roofline_table_on_a_synthetic_document():
    calib = rf.H200_FIELD_NOTES
    title, columns, rows, notes = rf.roofline_table(_doc(ROWS), calib,
                                                    shape_set=ShapeSet("t", 1, "sha256:x", "", (TINY,)))
    assert "roofline" in title and columns[:2] == ["shape", "backend:route"]
    assert [r[:2] for r in rows] == [["tiny", "fla:flag"], ["tiny", "gdnbench:fused_qk"], ["tiny", "gdnbench:fused_q"]]
    assert any("long: no dimensions" in n for n in notes)  # not in the given set
    col = {c: i for i, c in enumerate(columns)}
    f = rf.floor_us(TINY, "flag", calib)
    assert rows[0][col["MB"]] == f"{f.bytes / 1e6:.1f}"
    assert rows[0][col["floor/gpu"]] == f"{f.floor_us / 20.0:.3f}"
    assert rows[0][col["binds"]] == f.binding
    assert rows[2][col["floor/gpu"]] == "incorrect" and rows[2][col["gpu µs"]] == "-"
    assert "|" in to_markdown([Table(title, columns, rows, notes)])


def test_roofline_table_from_labels_and_from_the_shapes_dir():
    calib = rf.H200_FIELD_NOTES
    _, columns, rows, notes = rf.roofline_table(_doc(ROWS), calib)
    assert any("labels" in n for n in notes)
    long_rows = [r for r in rows if r[0] == "long"]
    assert [r[1] for r in long_rows] == ["fla:explicit", "fla:flag"]
    frac = float(long_rows[0][columns.index("floor/gpu")])
    assert 0.14 < frac < 0.17
    # the set under shapes/ is used when the file's hash matches it
    from gdnbench.data import shapes

    ss = shapes.load("gdn-qwen6")
    d = _doc([_row("h2_hv8_serving", "fla", "flag", 176.0, 700.0)], name="gdn-qwen6",
             labels={s.id: s.label() for s in ss.shapes}, hash_=ss.hash)
    _, _, rows, notes = rf.roofline_table(d, calib)
    assert not any("labels" in n for n in notes)
    expect = rf.floor_us(ss.get("h2_hv8_serving"), "flag", calib)
    assert rows[0][5] == f"{expect.floor_us:.1f}"


def test_shape_from_label_round_trip():
    s = rf.shape_from_label("x", "kda H96/HV96 K128 V128 6seq/8192")
    assert s.family == "kda" and s.tokens == 8192 and s.n_seqs == 6 and s.HV == 96
    s = rf.shape_from_label("x", "gdn H2/HV8 K64 V32 T1024xB4")
    assert (s.B, s.lens, s.K, s.V) == (4, (1024,), 64, 32)
    with pytest.raises(rf.RooflineError, match="label"):
        rf.shape_from_label("x", "nonsense")


def test_roofline_chart_writes_a_png(tmp_path):
    out = rf.roofline_chart(_doc(ROWS), rf.H200_FIELD_NOTES, tmp_path / "r.png")
    assert out.exists() and out.read_bytes()[:4] == b"\x89PNG"
    best = rf.best_floors(_doc(ROWS), rf.H200_FIELD_NOTES)
    assert best[("tiny", "gdnbench")].route == "fused_qk" and best[("long", "fla")].route == "explicit"
    with pytest.raises(rf.RooflineError, match="nothing to chart"):
        rf.roofline_chart(_doc([_row("tiny", "fla", "flag", status="error")]), rf.H200_FIELD_NOTES, tmp_path / "x.png")


# ----------------------------------------------------------------------------- calibration
def test_calibration_save_load_round_trip(tmp_path):
    calib = rf.make_calib(4.3e12, 790e12, gpu={"name": "NVIDIA H200", "driver_version": "580.159.04"},
                          versions={"torch": "2.11.0"}, date_utc="2026-11-30T00:00:00Z",
                          copy={"samples_us": [1.0, 2.0]})
    path = calibrate.save(calib, calibrate.default_path("NVIDIA H200", tmp_path))
    assert path == tmp_path / "nvidia-h200" / "calibration.json"
    assert calibrate.load_for("NVIDIA H200", tmp_path) == calib
    assert calibrate.load_for_doc(_doc([]), tmp_path) == calib
    assert calibrate.load_for("NVIDIA B200", tmp_path) is None
    assert "4.30 TB/s" in calibrate.summary(calib)
    path.write_text(json.dumps({"bandwidth_bytes_per_s": -1}))
    with pytest.raises(calibrate.CalibrationError, match="bandwidth_bytes_per_s"):
        calibrate.load_for("NVIDIA H200", tmp_path)
    path.write_text("{")
    with pytest.raises(calibrate.CalibrationError, match="not valid JSON"):
        calibrate.load(path)
    with pytest.raises(calibrate.CalibrationError, match="gpu.name"):
        calibrate.save({"bandwidth_bytes_per_s": 1.0, "matmul_flops_per_s": 1.0})


def test_measure_without_cuda_raises_a_clear_error(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(calibrate.NoCudaError, match="needs a CUDA device"):
        calibrate.measure()
    with pytest.raises(calibrate.NoCudaError, match="not one"):
        calibrate.measure(device="cpu")


@pytest.mark.gpu
def test_measure_on_a_gpu():
    c = calibrate.measure(copy_bytes=2**28, matmul_n=2048, warmup=1, repeats=3)
    assert c["bandwidth_bytes_per_s"] > 1e11 and c["matmul_flops_per_s"] > 1e12
    assert c["gpu"]["name"] and c["versions"]["torch"] and len(c["copy"]["samples_us"]) == 3


def test_calibration_beside_the_results_file_is_found_from_any_directory(tmp_path, monkeypatch):
    """results/<gpu>/ holds the runs and their GPU's calibration: a report run from inside it (or from
    anywhere) finds the sibling, and ignores a sibling of another GPU."""
    calib = rf.make_calib(4.15e12, 774e12, gpu={"name": "NVIDIA H200"}, versions={}, date_utc="x")
    gpu_dir = tmp_path / "results" / "nvidia-h200"
    calibrate.save(calib, gpu_dir / "calibration.json")
    run = gpu_dir / "run.json"
    monkeypatch.chdir(gpu_dir)  # ./results does not exist here
    assert calibrate.load_for_doc(_doc([])) is None
    assert calibrate.load_for_doc(_doc([]), beside=run) == calib
    other = dict(calib, gpu={"name": "NVIDIA B200"})
    calibrate.save(other, tmp_path / "b200" / "calibration.json")
    assert calibrate.load_for_doc(_doc([]), beside=tmp_path / "b200" / "run.json") is None
