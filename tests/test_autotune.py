"""The autotuner without a GPU: space and pruning, search strategies on fake costs, sharding,
the cache (keys, staleness, lookup), the dry-run CLI, and both families' candidates evaluated for
real by a CPU worker (interpreter, fp32 smoke shapes: times not meaningful).

Nothing here imports triton at module load: test_ops_gdn must set TRITON_INTERPRET=1 before
triton is first imported (at collection), so triton-backed names are imported inside tests.
"""

import json
import warnings

import pytest
import typer
from typer.testing import CliRunner

from gdnbench.autotune import bench as at_bench, dist as at_dist, plan as at_plan, report as at_report, search as at_search, space as at_space, tune as at
from gdnbench.bench import worker as at_worker
from gdnbench.data import shapes as shp
from gdnbench.kernels import cache_key, tuned
from gdnbench.vocab import ROUTES


def _tuned(*args):
    """(config, label) of a lookup: tuned.tuned_winners with its winners as text."""
    cfg, won = tuned.tuned_winners(*args)
    return cfg, won.label()


def _shape(**kw):
    base = dict(id="s", family="gdn", H=16, HV=32, K=128, V=128, lens=(8192,), seed=1, gate="logsigmoid",
                dtype="bfloat16")
    return shp.Shape(**{**base, **kw})


def _kda_shape(**kw):
    return _shape(**{"family": "kda", "gate": "bounded", "lower_bound": -5.0, **kw})


# ----------------------------------------------------------------------------- space
def test_space_has_maxnreg_caps_and_prunes_by_validate():
    from gdnbench.kernels.config import SMEM_LIMIT_BYTES, KernelConfig, _smem_estimate

    space = at_space.build_space("output", 256, 256, "float32")
    dims = dict(space.dims)
    assert dims["maxnreg"][0] is None and 64 in dims["maxnreg"] and 248 in dims["maxnreg"]
    assert dims["BK"] == (16, 32, 64, 128, 256)
    big = {"BK": 256, "BV": 256, "num_warps": 8, "num_stages": 4, "maxnreg": None}
    smem = _smem_estimate("output", KernelConfig(**{k: v for k, v in big.items()}), 256, 256, 4)
    assert smem > SMEM_LIMIT_BYTES and not space.is_valid(big)
    # the register file: 255-ish registers x 512 threads does not fit, 128 does
    assert not space.is_valid({"BK": 64, "BV": 64, "num_warps": 16, "num_stages": 1, "maxnreg": 248})
    assert space.is_valid({"BK": 64, "BV": 64, "num_warps": 16, "num_stages": 1, "maxnreg": 128})
    assert space.is_valid(space.start)
    valid = space.valid_points()
    assert 0 < len(valid) < space.total
    assert space.valid_points(limit=257) == valid[:257]  # a search asks for one more than it tries whole


@pytest.mark.parametrize("kernel,K,V,dtype,family,variant", [
    ("output", 256, 256, "float32", "gdn", "plain"), ("fused_out", 128, 128, "bfloat16", "gdn", "fused_qk"),
    ("wu", 32, 16, "float32", "gdn", "plain"), ("l2norm", 100, 60, "float16", "kda", "plain"),
    ("kda16_prep", 128, 128, "bfloat16", "kda", "fused_q"), ("aqk", 256, 128, "bfloat16", "gdn", "plain"),
    ("state_out", 64, 64, "float16", "kda", "plain")])
def test_a_spaces_validity_test_is_validate_of_the_whole_config(kernel, K, V, dtype, family, variant):
    """build_space checks a point's kernel config alone (kernels.config.kernel_check); its verdict is validate()'s
    on the whole config, at a prime stride of points, about 2 500 a space (aqk at K 256: a form that cannot run,
    every point refused; GDN's state_out under KDA: a kernel KDA does not launch, every point passed)."""
    from gdnbench.kernels.config import default_config, validate
    from gdnbench.vocab import dtype_bytes

    space = at_space.build_space(kernel, K, V, dtype, family, variant)
    base = default_config(K, V, dtype_bytes(dtype), family)
    verdicts, stride = set(), next(p for p in (5, 199, 409) if space.total // p <= 2600)
    for i, point in enumerate(space.points()):
        if i % stride:
            continue
        try:
            validate(at_space.full_config(kernel, point, base), K, V, dtype_bytes(dtype), family)
            whole = True
        except ValueError:
            whole = False
        assert space.is_valid(point) == whole, point
        verdicts.add(whole)
    assert verdicts == {"aqk": {False}, "state_out": {True}}.get(kernel, {False, True})


def test_start_point_is_the_default_config_and_blocks_are_clamped():
    from gdnbench.kernels.config import GDNConfig, KernelConfig, validate

    space = at_space.build_space("output_fused", 32, 32, "float32")
    assert space.start == {"BK": 32, "BV": 32, "num_warps": 4, "num_stages": 3, "maxnreg": 168}
    assert dict(space.dims)["BK"] == (16, 32)  # 64.. would compile to the same code as 32
    assert space.is_valid({**space.start, "BK": 16})  # two K tiles are fine in the fused launch too
    assert not space.is_valid({**space.start, "num_warps": 16, "maxnreg": 248})  # register file
    with pytest.raises(ValueError, match="register file"):
        validate(GDNConfig(state=KernelConfig(BV=32, num_warps=16, num_stages=2, maxnreg=200)), 128, 128)


@pytest.mark.parametrize("K,V", [(60, 100), (100, 60), (24, 24)])
def test_spaces_at_head_sizes_not_multiples_of_16(K, V):
    """Blocks up to the next power of two of each head size, a valid start point, valid points in every
    kernel's space, for both families."""
    for family, kernels in (("gdn", ("gram", "wu", "state", "output", "output_fused", "aqk", "state_out", "fused_out")),
                            ("kda", ("kda_intra", "wu", "state", "output", "output_fused"))):
        for kernel in kernels:
            space = at_space.build_space(kernel, K, V, "float16", family)
            dims = dict(space.dims)
            top = {"BK": 1 << (K - 1).bit_length(), "BV": 1 << (V - 1).bit_length()}
            for b in ("BK", "BV"):
                if b in dims:
                    assert max(dims[b]) == top[b], (kernel, b, dims[b])
            assert space.is_valid(space.start), (family, kernel, space.start)
            assert at_space.count_valid(kernel, K, V, "float16", family) > 0


def test_fused_qk_loop_also_searches_where_k_rstd_comes_from():
    """Only fused_out's fused_qk variant has the k_rstd_tile and c_last_from_tile dimensions (the other variants
    compile the same code either way); they come first, at their default False, c_last_from_tile valid with the tile
    only; other kernels may set neither."""
    from gdnbench.kernels.config import GDNConfig, KernelConfig, validate

    qk = at_space.build_space("fused_out", 128, 128, "bfloat16", "gdn", "fused_qk")
    assert qk.dims[:2] == [("k_rstd_tile", (False, True)), ("c_last_from_tile", (False, True))]
    assert qk.start["k_rstd_tile"] is False and qk.start["c_last_from_tile"] is False
    assert qk.is_valid({**qk.start, "k_rstd_tile": True})
    assert qk.is_valid({**qk.start, "k_rstd_tile": True, "c_last_from_tile": True})
    assert not qk.is_valid({**qk.start, "c_last_from_tile": True})  # c_last comes from the tile
    for variant in ("plain", "fused_q"):
        dims = dict(at_space.build_space("fused_out", 128, 128, "bfloat16", "gdn", variant).dims)
        assert "k_rstd_tile" not in dims and "c_last_from_tile" not in dims
    for flag in ("k_rstd_tile", "c_last_from_tile"):
        with pytest.raises(ValueError, match=flag):
            validate(GDNConfig(state_out=KernelConfig(BK=64, BV=32, **{flag: True})), 128, 128)


def test_kda16_prep_searches_its_step_and_where_the_fused_sums_come_from():
    """kda16_prep searches BK (its K channels a step) in every variant and mma_sums under the fused routes only (the
    plain variant takes no sums); other kernels may not set mma_sums."""
    from gdnbench.kernels.config import GDNConfig, KernelConfig, validate

    plain = dict(at_space.build_space("kda16_prep", 128, 128, "bfloat16", "kda", "plain").dims)
    assert plain["BK"] == (16, 32, 64, 128) and "mma_sums" not in plain
    for variant in ("fused_q", "fused_qk"):
        space = at_space.build_space("kda16_prep", 128, 128, "bfloat16", "kda", variant)
        assert dict(space.dims)["mma_sums"] == (False, True) and space.start["mma_sums"] is False
        assert space.is_valid({**space.start, "mma_sums": True, "BK": 64})
    with pytest.raises(ValueError, match="mma_sums"):
        validate(GDNConfig(kda_chunk16=True, kda16_loop=KernelConfig(BV=64, mma_sums=True)), 128, 128, 2, "kda")


def test_kda16_prep_searches_whether_t_is_specialized():
    """generic_t (the prepare kernel compiled for any T) is a dimension of every kda16_prep variant, from False (the
    specialized compile that entries without the field ran); no other kernel may set it."""
    from gdnbench.kernels.config import GDNConfig, KernelConfig, validate

    for variant in ("plain", "fused_q", "fused_qk"):
        space = at_space.build_space("kda16_prep", 128, 128, "bfloat16", "kda", variant)
        assert dict(space.dims)["generic_t"] == (False, True) and space.start["generic_t"] is False
        assert space.is_valid({**space.start, "generic_t": True})
    assert "generic_t" not in dict(at_space.build_space("kda16_loop", 128, 128, "bfloat16", "kda", "plain").dims)
    with pytest.raises(ValueError, match="only kda16_prep compiles for any T"):
        validate(GDNConfig(kda_chunk16=True, kda16_loop=KernelConfig(BV=64, generic_t=True)), 128, 128, 2, "kda")


def test_aqk_searches_when_it_loads_the_gates():
    """aqk's every variant has early_gates first, at its default False (the shipped entries' code)."""
    for variant in ("plain", "fused_q", "fused_qk"):
        space = at_space.build_space("aqk", 128, 128, "bfloat16", "gdn", variant)
        assert space.dims[0] == ("early_gates", (False, True)) and space.start["early_gates"] is False
        assert space.is_valid({**space.start, "early_gates": True})
    assert "early_gates" not in dict(at_space.build_space("fused_out", 128, 128, "bfloat16", "gdn", "plain").dims)


def test_gram_and_aqk_search_their_grid_order():
    """gram and aqk search heads_first, from its default False (the order the entries before it ran); no other kernel
    has it."""
    for kernel, variants in (("gram", ("plain", "fuse_k")), ("aqk", ("plain", "fused_q", "fused_qk"))):
        for variant in variants:
            space = at_space.build_space(kernel, 128, 128, "bfloat16", "gdn", variant)
            assert dict(space.dims)["heads_first"] == (False, True) and space.start["heads_first"] is False
            assert space.is_valid({**space.start, "heads_first": True})
    for kernel in ("wu", "fused_out", "state"):
        assert "heads_first" not in dict(at_space.build_space(kernel, 128, 128, "bfloat16", "gdn", "plain").dims)


def test_kda_space_tunes_kda_intra_block_and_prunes_with_gate_tiles():
    from gdnbench.kernels.config import SMEM_LIMIT_BYTES, KernelConfig, _smem_estimate

    space = at_space.build_space("kda_intra", 128, 128, "bfloat16", "kda")
    assert [d for d, _ in space.dims] == ["BK", "num_warps", "num_stages", "maxnreg"]
    assert dict(space.dims)["BK"] == (16, 32, 64, 128)
    assert space.start == {"BK": 16, "num_warps": 2, "num_stages": 3, "maxnreg": None}  # the KDA default
    big = {"BK": 128, "num_warps": 4, "num_stages": 4, "maxnreg": None}
    assert _smem_estimate("kda_intra", KernelConfig(**big), 128, 128, 2, "kda") > SMEM_LIMIT_BYTES
    assert not space.is_valid(big) and space.is_valid({**big, "num_stages": 3})
    assert 0 < at_space.count_valid("kda_intra", 128, 128, "bfloat16", "kda") < space.total
    # KDA's w/u also streams fp32 gate tiles: fewer points fit than for GDN
    assert at_space.count_valid("wu", 256, 256, "float32", "kda") < at_space.count_valid("wu", 256, 256, "float32", "gdn")
    assert not at_space.build_space("wu", 256, 256, "float32", "kda").is_valid(
        {"BK": 256, "BV": 256, "num_warps": 8, "num_stages": 2, "maxnreg": None})


def test_kda_tasks_per_route():
    tasks = at_plan.plan_tasks(list(ROUTES), list(at_space.KERNELS), "kda")
    assert [(t.kernel, t.variant, t.route) for t in tasks] == [
        ("l2norm", "plain", "flag"), ("kda_intra", "plain", "flag"), ("wu", "plain", "flag"),
        ("state", "plain", "flag"), ("output", "plain", "flag"), ("kda_state_out", "plain", "flag"),
        ("kda16_prep", "plain", "flag"), ("kda16_loop", "plain", "flag"),
        ("output_fused", "fused_q", "fused_q"), ("kda_state_out", "fused_q", "fused_q"),
        ("kda16_prep", "fused_q", "fused_q"),
        ("kda_intra", "fuse_k", "fused_qk"), ("wu", "fuse_k", "fused_qk"), ("kda16_prep", "fused_qk", "fused_qk")]
    assert {t.family for t in tasks} == {"kda"}
    # the state kernel runs plain on every route: KDA's reads kg (k's rstd already in it), GDN's
    # v_new carries k's rstd on its rows
    assert tuned.variant_of("state", "fused_qk", "kda") == "plain" and tuned.variant_of("state", "fused_qk") == "plain"
    assert tuned.variant_of("output_fused", "fused_qk", "kda") == "fused_q"
    assert tuned.variant_of("output_fused", "fused_qk") == "fused_qk"
    assert tuned.variant_of("state_out", "fused_qk") == tuned.variant_of("state_out", "fused_q") == "fused_q"
    # aqk bounds raw k's products under fused_qk (FUSE_K): its own specialization
    assert [tuned.variant_of("aqk", r) for r in ROUTES] == ["plain", "plain", "fused_q", "fused_qk"]
    # the in-loop form's loop: FUSE_Q under both fused routes, FUSE_K under fused_qk too
    assert [tuned.variant_of("fused_out", r) for r in ROUTES] == ["plain", "plain", "fused_q", "fused_qk"]
    # KDA's 16-token form: the prepare kernel's NORM_Q / NORM_K per route; its loop is one kernel for every route
    assert [tuned.variant_of("kda16_prep", r, "kda") for r in ROUTES] == ["plain", "plain", "fused_q", "fused_qk"]
    assert [tuned.variant_of("kda16_loop", r, "kda") for r in ROUTES] == ["plain"] * 4
    assert at_plan.plan_tasks(["fused_qk"], ["gram"], "kda") == [] and at_plan.plan_tasks(["flag"], ["kda_intra"]) == []


def test_plan_tasks_dedupes_specializations():
    tasks = at_plan.plan_tasks(["explicit", "flag"], list(at_space.KERNELS))
    assert [t.kernel for t in tasks] == ["l2norm", "gram", "wu", "state", "output", "aqk", "state_out", "fused_out"]
    assert [(t.kernel, t.variant, t.route) for t in at_plan.plan_tasks(["fused_q", "fused_qk"], ["aqk", "state_out"])] == [
        ("aqk", "fused_q", "fused_q"), ("state_out", "fused_q", "fused_q"), ("aqk", "fused_qk", "fused_qk")]
    assert [(t.kernel, t.variant, t.route) for t in at_plan.plan_tasks(list(ROUTES), ["fused_out"])] == [
        ("fused_out", "plain", "flag"), ("fused_out", "fused_q", "fused_q"), ("fused_out", "fused_qk", "fused_qk")]
    assert {t.variant for t in tasks} == {"plain"}
    tasks = at_plan.plan_tasks(list(ROUTES), ["gram", "output_fused"])
    assert [(t.kernel, t.variant, t.route) for t in tasks] == [
        ("gram", "plain", "flag"), ("output_fused", "fused_q", "fused_q"), ("gram", "fuse_k", "fused_qk"),
        ("output_fused", "fused_qk", "fused_qk")]


# ----------------------------------------------------------------------------- search
def _separable_space(valid=lambda p: True):
    dims = [("a", (0, 1, 2, 3, 4)), ("b", (10, 20, 30)), ("c", (None, 64, 128, 192))]
    return at_space.Space("fake", dims, {"a": 0, "b": 10, "c": None}, valid)


def _cost(p):
    c = 0 if p["c"] is None else p["c"]
    return 100 + (p["a"] - 3) ** 2 + abs(p["b"] - 20) / 5 + abs(c - 128) / 32


def _fake(fn):
    calls = []

    def evaluate(points):
        calls.extend(points)
        return [fn(p) for p in points], 1.0 * len(points)

    return evaluate, calls


def test_a_short_stage_is_timed_over_several_calls_per_graph_replay():
    """The replay's own cost (about 10 µs on an H100) must not swamp a short kernel's: calls per replay fill
    REPLAY_MIN_US, at least one, at most STAGE_CALLS_MAX."""
    assert at_bench.calls_per_replay(36.0) == 6
    assert at_bench.calls_per_replay(5.0) == at_bench.STAGE_CALLS_MAX
    assert at_bench.calls_per_replay(0.0) == at_bench.STAGE_CALLS_MAX
    assert at_bench.calls_per_replay(at_bench.REPLAY_MIN_US) == 1
    assert at_bench.calls_per_replay(700.0) == 1


def test_coordinate_descent_finds_optimum_of_separable_function():
    evaluate, calls = _fake(lambda p: {"status": "ok", "reason": "", "time_us": _cost(p)})
    res = at_search.search(_separable_space(), evaluate, budget_s=1e9, exhaustive_max=10, min_gain=0.0)
    assert res.strategy == "coordinate_descent" and res.stopped == "converged"
    assert res.best["config"] == {"a": 3, "b": 20, "c": 128}
    assert res.default["config"] == {"a": 0, "b": 10, "c": None}
    assert len(calls) == len({at_space.point_key(p) for p in calls}) < 5 * 3 * 4  # no point twice, fewer than all


def test_descent_starts_from_the_fastest_seed_and_keeps_the_default_as_default():
    evaluate, calls = _fake(lambda p: {"status": "ok", "reason": "", "time_us": _cost(p)})
    seeds = [{"c": 128, "a": 3, "b": 30}, {"a": 0, "b": 10, "c": None}, {"a": 9, "b": 10, "c": None}]
    res = at_search.search(_separable_space(lambda p: p["a"] < 5), evaluate, budget_s=1e9, exhaustive_max=10,
                    min_gain=0.0, seeds=seeds)
    # one batch: the default, then the valid seed (in dimension order); the duplicate and the invalid one dropped
    assert calls[:2] == [{"a": 0, "b": 10, "c": None}, {"a": 3, "b": 30, "c": 128}]
    assert list(calls[1]) == ["a", "b", "c"]
    assert res.default["config"] == {"a": 0, "b": 10, "c": None}
    assert res.best["config"] == {"a": 3, "b": 20, "c": 128}
    # a seed searched before dimension c existed takes the start's value for it; one with an unknown
    # dimension is dropped
    ev3, calls3 = _fake(lambda p: {"status": "ok", "reason": "", "time_us": _cost(p)})
    at_search.search(_separable_space(), ev3, budget_s=1e9, exhaustive_max=10, min_gain=0.0,
              seeds=[{"a": 3, "b": 20}, {"a": 1, "b": 20, "z": 0}])
    assert calls3[:2] == [{"a": 0, "b": 10, "c": None}, {"a": 3, "b": 20, "c": None}]
    assert {"a": 1, "b": 20, "c": None} not in calls3[:2]
    # the first seed (a --retune's own winner) is also tried at each other value of the dimension it predates,
    # in the anchors' batch, before the descent's budget check
    assert calls3[2:5] == [{"a": 3, "b": 20, "c": c} for c in (64, 128, 192)]  # c None: the seed itself
    ev4, calls4 = _fake(lambda p: {"status": "ok", "reason": "", "time_us": _cost(p)})
    res4 = at_search.search(_separable_space(), ev4, budget_s=0.0, exhaustive_max=10, min_gain=0.0,
                            seeds=[{"a": 3, "b": 20}, {"a": 1, "b": 10}])
    assert res4.stopped == "budget" and res4.best["config"] == {"a": 3, "b": 20, "c": 128}
    assert {"a": 1, "b": 10, "c": 64} not in calls4  # later seeds are not expanded
    # from the seed, one pass finds the optimum: fewer evaluations than from the default
    ev2, calls2 = _fake(lambda p: {"status": "ok", "reason": "", "time_us": _cost(p)})
    at_search.search(_separable_space(lambda p: p["a"] < 5), ev2, budget_s=1e9, exhaustive_max=10, min_gain=0.0)
    assert len(calls) < len(calls2)


def test_seed_points_come_from_current_entries_of_the_same_kernel_and_family(tmp_path):
    from gdnbench.data import shapes as shp

    env = {"gpu": "Fake GPU", "compute_capability": "9.0", "triton": "3.6.0"}
    ss = shp.load("gdn-qwen6")
    a, b = ss.get("h16_hv32_fixed8k"), ss.get("h16_hv64_fixed8k")
    kda = shp.load("kda-legacy6").get("h96_fixed")
    task = at_plan.Task("gram", "fuse_k", "fused_qk", "gdn")

    def save(shape, variant, cfg, source=None, family_kernel="gram"):
        key = cache_key.entry_key(env, family_kernel, shape, variant)
        if source:
            key["source_hash"] = source
        tuned.save_entry(tmp_path, {"key": key, "kernel": family_kernel, "best": {"config": cfg, "time_us": 1.0}})

    p1 = {"BK": 64, "num_warps": 1, "num_stages": 3, "maxnreg": 168}
    p2 = {"BK": 32, "num_warps": 1, "num_stages": 2, "maxnreg": None}
    save(b, "plain", p2)                       # another shape of the family
    save(a, "plain", p1)                       # this shape, another variant: first
    p5 = {"BK": 16, "num_warps": 8, "num_stages": 1, "maxnreg": None}
    save(b, "fuse_k", {"BK": 128, "num_warps": 2, "num_stages": 1, "maxnreg": None}, source="sha256:old")  # stale
    save(kda, "plain", {"BK": 16, "num_warps": 4, "num_stages": 4, "maxnreg": None})  # other family
    assert at_search.seed_points(tmp_path, env, task, a) == [p1, p2]
    assert at_search.seed_points(tmp_path, env, task, a, limit=1) == [p1]
    # this very search's winner on older code (the edit made it stale) seeds first
    p0 = {"BK": 16, "num_warps": 2, "num_stages": 2, "maxnreg": None}
    save(a, "fuse_k", p0, source="sha256:old")
    assert at_search.seed_points(tmp_path, env, task, a) == [p0, p1, p2]
    # its current winner (a --retune) before that
    save(a, "fuse_k", p5)
    assert at_search.seed_points(tmp_path, env, task, a)[0] == p5
    # then the same search's winner on another GPU of the same architecture (what a run borrows); another's is not
    p4 = {"BK": 64, "num_warps": 2, "num_stages": 1, "maxnreg": 200}
    p6 = {"BK": 32, "num_warps": 4, "num_stages": 1, "maxnreg": 96}
    for gpu, cc, cfg in (("Sibling GPU", "9.0", p4), ("Other arch", "10.0", p6)):
        key = {**cache_key.entry_key(env, "gram", a, "fuse_k"), "gpu": gpu, "compute_capability": cc}
        tuned.save_entry(tmp_path, {"key": key, "kernel": "gram", "best": {"config": cfg, "time_us": 1.0}})
    assert at_search.seed_points(tmp_path, env, task, a) == [p5, p4, p1, p2]
    # the output kernels seed each other
    p3 = {"BK": 128, "BV": 128, "num_warps": 4, "num_stages": 2, "maxnreg": None}
    save(a, "plain", p3, family_kernel="output")
    fused = at_plan.Task("output_fused", "fused_q", "fused_q", "gdn")
    assert at_search.seed_points(tmp_path, env, fused, a) == [p3]


def test_exhaustive_when_small_and_budget_stops_descent():
    evaluate, calls = _fake(lambda p: {"status": "ok", "reason": "", "time_us": _cost(p)})
    res = at_search.search(_separable_space(), evaluate, budget_s=1e9, exhaustive_max=100)
    assert res.strategy == "exhaustive" and len(calls) == 60 and calls[0] == {"a": 0, "b": 10, "c": None}
    assert res.best["config"] == {"a": 3, "b": 20, "c": 128}
    # nearest the default first: the 4 + 2 + 3 single changes before any point that changes two dimensions
    start = calls[0]
    changed = [sum(p[d] != start[d] for d in start) for p in calls]
    assert changed == sorted(changed) and changed[1:10] == [1] * 9
    evaluate, calls = _fake(lambda p: {"status": "ok", "reason": "", "time_us": _cost(p)})
    res = at_search.search(_separable_space(), evaluate, budget_s=20, exhaustive_max=100, batch=32)
    assert res.stopped == "budget" and len(calls) == 32 and {"a": 3, "b": 10, "c": None} in calls
    evaluate, calls = _fake(lambda p: {"status": "ok", "reason": "", "time_us": _cost(p)})
    res = at_search.search(_separable_space(), evaluate, budget_s=3, exhaustive_max=10)
    assert res.stopped == "budget" and len(calls) == 5  # the default, then one sweep


def test_exhaustive_runs_the_seeds_and_their_single_changes_early():
    """A seed (another search's winner) runs right after the default, and the points one change from it
    come with the default's single changes, before any point two changes from both."""
    evaluate, calls = _fake(lambda p: {"status": "ok", "reason": "", "time_us": _cost(p)})
    seed = {"a": 4, "b": 30}  # from before dimension c: takes the default's c
    at_search.search(_separable_space(), evaluate, budget_s=1e9, exhaustive_max=100, seeds=[seed, {"z": 1}])
    anchors = [{"a": 0, "b": 10, "c": None}, {"a": 4, "b": 30, "c": None}]
    assert calls[:2] == anchors and len(calls) == 60
    near = [min(sum(p[d] != a[d] for d in a) for a in anchors) for p in calls]
    # 9 single changes each; (4, 10, None) and (0, 30, None) are one change from both
    assert near == sorted(near) and near.count(1) == 9 + 9 - 2
    assert {"a": 4, "b": 30, "c": 128} in calls[:2 + 16]


def test_failing_candidates_are_recorded_and_never_win():
    def fn(p):
        if p["a"] == 3:
            return {"status": "compile_error", "reason": "out of resources: shared memory", "time_us": None}
        if p["b"] == 30:
            raise RuntimeError("illegal memory access")
        return {"status": "ok", "reason": "", "time_us": _cost(p)}

    invalid = lambda p: p["c"] != 192  # noqa: E731
    res = at_search.search(_separable_space(invalid), at_plan.per_candidate(fn), budget_s=1e9, exhaustive_max=0, min_gain=0.0)
    by_status = {}
    for r in res.results:
        by_status.setdefault(r["status"], []).append(r)
    assert by_status["compile_error"][0]["reason"].startswith("out of resources")
    assert "illegal memory access" in by_status["error"][0]["reason"]
    assert res.best["status"] == "ok" and res.best["config"]["a"] != 3 and res.best["config"]["b"] != 30
    assert res.pruned >= 1 and all(r["config"]["c"] != 192 for r in res.results)


# ----------------------------------------------------------------------------- sharding
@pytest.mark.parametrize("n, world", [(0, 2), (1, 4), (7, 3), (25, 8), (16, 1)])
def test_shard_is_disjoint_and_covering(n, world):
    parts = [at_plan.shard(n, r, world) for r in range(world)]
    flat = sorted(i for p in parts for i in p)
    assert flat == list(range(n))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    # round-robin: a rank's candidates are `world` apart, so a batch's costly end is shared out
    assert all(b - a == world for p in parts for a, b in zip(p, p[1:]))


@pytest.mark.parametrize("rank, world", [(2, 2), (-1, 2), (0, 0)])
def test_shard_refuses_a_rank_outside_the_world(rank, world):
    with pytest.raises(ValueError, match=f"rank {rank} of world {world}"):
        at_plan.shard(5, rank, world)


def test_sharded_evaluator_merges_in_batch_order():
    world = 3
    points = [{"a": i} for i in range(8)]
    local_calls = {}

    def make(rank):
        def local(pts):
            local_calls[rank] = [p["a"] for p in pts]
            return [{"status": "ok", "time_us": float(p["a"]), "rank": rank} for p in pts], 1.0 + rank
        return local

    def all_gather(obj):  # every rank's share, as torch.distributed would gather them
        return [make(r)([points[i] for i in at_plan.shard(len(points), r, world)]) for r in range(world)]

    ev = at_dist.sharded(make(0), at_dist.Dist(rank=0, world=world, all_gather=all_gather))
    merged, seconds = ev(points)
    assert [r["time_us"] for r in merged] == list(range(8))
    assert [r["rank"] for r in merged] == [i % world for i in range(8)]
    assert seconds == 3.0  # the slowest rank


def test_relaunch_command_uses_torchrun():
    from gdnbench.cli.autotune import relaunch_command

    from gdnbench.cli.autotune import _argv

    assert _argv({"seeds": True, "retune": False, "budget": 5.0}) == ["--budget", "5.0"]
    assert _argv({"seeds": False, "retune": True}) == ["--no-seeds", "--retune"]
    cmd = relaunch_command(["--budget", "5"], 4)
    assert cmd[1:5] == ["-m", "gdnbench.cli.autotune", "torchrun", "--standalone"] and "--nproc-per-node=4" in cmd
    assert cmd[-3:] == ["autotune", "--budget", "5"]


def test_worker_that_cannot_start_is_a_recorded_error():
    spec = {"shape_set": "/nonexistent.toml", "shape_id": "x", "device": "cpu", "check_tokens": 64,
            "params": {"warmup": 0, "rounds": 1, "iters": 1}}
    client = at_worker.WorkerClient(spec, "cpu", timeout_s=60, start_timeout_s=60)
    try:
        assert client.ensure_started() is None and "no such shape file" in client.last_error
        res = client.evaluate("gram", "flag", {"BK": 16})
        assert res["status"] == "error" and "failed to start" in res["reason"]
        assert client.evaluate("gram", "flag", {"BK": 16})["reason"] == "worker cannot start (failed twice)"
    finally:
        client.close()


# ----------------------------------------------------------------------------- cache
ENV = {"gpu": "NVIDIA H200", "compute_capability": "9.0", "triton": "3.6.0"}
B200 = {"gpu": "NVIDIA B200", "compute_capability": "10.0", "triton": "3.6.0"}


def _entry(shape, kernel="state", variant="plain", best=None, **key):
    best = best or {"BV": 64, "num_warps": 4, "num_stages": 3, "maxnreg": 128}
    default = {"BV": 32, "num_warps": 4, "num_stages": 3, "maxnreg": None}
    return {"key": {**cache_key.entry_key(ENV, kernel, shape, variant), **key}, "kernel": kernel, "variant": variant,
            "route": "flag", "default": {"config": default, "time_us": 160.0},
            "best": {"config": best, "time_us": 120.0}, "search": {"evaluated": 30, "failed": 2},
            "candidates": [{"config": {**default, "maxnreg": r}, "status": "ok", "time_us": 150.0 - r / 10}
                           for r in (64, 128)] + [{"config": default, "status": "ok", "time_us": 160.0}]}


def test_shape_key_and_bucket():
    assert cache_key.token_bucket(8192) == 8192 and cache_key.token_bucket(8193) == 16384 and cache_key.token_bucket(3) == 64
    k = cache_key.shape_key(_shape())
    assert k == "gdn_K128_V128_H16_HV32_bfloat16_fixed_T8192"
    assert cache_key.shape_key(_shape(lens=(1300, 547, 2048))) == "gdn_K128_V128_H16_HV32_bfloat16_varlen_T4096"
    assert cache_key.shape_key(_kda_shape()) == "kda_K128_V128_H16_HV32_bfloat16_fixed_T8192"
    assert tuned.source_hash("state").startswith("sha256:") and tuned.source_hash("state") != tuned.source_hash("gram")
    assert tuned.variant_of("gram", "fused_qk") == "fuse_k" and tuned.variant_of("output", "flag") == "plain"


def test_source_hash_follows_each_kernels_own_code(tmp_path, monkeypatch):
    """An edit stales exactly the kernels whose jit functions reach the edited definition."""
    import shutil

    def hashes(kernel_dir):
        monkeypatch.setattr(cache_key, "KERNEL_DIR", kernel_dir)
        cache_key.clear_caches()
        return {k: cache_key.source_hash(k) for k in cache_key.KERNEL_FUNCTIONS}

    kdir = tmp_path / "kernels"
    shutil.copytree(cache_key.KERNEL_DIR, kdir)
    try:
        before = hashes(kdir)
        assert before["output"] == before["output_fused"] and len(set(before.values())) == len(before) - 1
        intra = kdir / "intra.py"
        intra.write_text(intra.read_text().replace("def gram_solve_kernel(", "def gram_solve_kernel(  ", 1))
        after = hashes(kdir)
        assert [k for k in before if before[k] != after[k]] == ["gram"]
        common = kdir / "common.py"
        common.write_text(common.read_text().replace("SSQ_LO = tl.constexpr(2.0**-70)",
                                                     "SSQ_LO = tl.constexpr(2.0**-71)"))
        changed = {k for k, h in hashes(kdir).items() if h != after[k]}
        # via row_rstd / l2_rstd
        assert changed == {"l2norm", "gram", "kda_intra", "output", "output_fused", "aqk", "kda_state_out"}
    finally:  # the caches must not keep the copy's hashes for later tests
        cache_key.clear_caches()


def test_tuned_winners_use_the_matching_entry(tmp_path):
    from gdnbench.kernels.config import KernelConfig

    shape = _shape()
    tuned.save_entry(tmp_path, _entry(shape))
    cfg, label = _tuned(shape, "flag", ENV, tmp_path)
    assert cfg.state == KernelConfig(BV=64, num_warps=4, num_stages=3, maxnreg=128)
    assert label.startswith("tuned: state[") and "r=128" in label
    assert cfg.gram == _tuned(shape, "flag", None, tmp_path)[0].gram  # untouched kernels: default
    # fused_qk runs the same (plain) state kernel
    assert _tuned(shape, "fused_qk", ENV, tmp_path)[0].state == cfg.state
    # another architecture, another shape bucket, no env: default
    assert _tuned(shape, "flag", B200, tmp_path)[1] == "default"
    assert _tuned(_shape(lens=(32768,)), "flag", ENV, tmp_path)[1] == "default"
    assert _tuned(shape, "flag", None, tmp_path)[1] == "default"
    # a second save replaces the entry of the same identity
    tuned.save_entry(tmp_path, _entry(shape, best={"BV": 16, "num_warps": 2, "num_stages": 2, "maxnreg": None}))
    doc = json.loads((tmp_path / "nvidia-h200" / "state.json").read_text())
    assert len(doc["entries"]) == 1 and _tuned(shape, "flag", ENV, tmp_path)[0].state.BV == 16


def test_a_gpu_without_entries_borrows_those_of_its_architecture(tmp_path, monkeypatch):
    """An H100 runs the H200's winners where it has none of its own, and says so; its own entries, another
    architecture's, GDNBENCH_TUNED=own and autotune's lookups (find_entry's default) borrow nothing."""
    h100 = {**ENV, "gpu": "NVIDIA H100 80GB HBM3"}
    shape = _shape()
    tuned.save_entry(tmp_path, _entry(shape))
    cfg, label = _tuned(shape, "flag", h100, tmp_path)
    assert cfg.state.maxnreg == 128
    assert label == "tuned: state[BV=64 w=4 s=3 r=128]; tuned on NVIDIA H200 (none here): state"
    assert tuned.find_entry(tmp_path, h100, "state", shape, "plain") is None
    task = at_plan.Task("state", "plain", "flag", "gdn")
    assert at_plan.cached_entry(tmp_path, h100, task, shape) is None  # autotune searches there all the same
    assert at_plan.cached_entry(tmp_path, ENV, task, shape) is not None
    assert tuned.find_entry(tmp_path, h100, "state", shape, "plain", True)["borrowed_from"] == "NVIDIA H200"
    assert _tuned(shape, "flag", {**h100, "triton": "3.7.0"}, tmp_path)[1] == "default"
    monkeypatch.setenv(tuned.DISABLE_ENV, "own")
    assert _tuned(shape, "flag", h100, tmp_path)[1] == "default"
    assert _tuned(shape, "flag", ENV, tmp_path)[0].state.maxnreg == 128
    monkeypatch.delenv(tuned.DISABLE_ENV)
    own = _entry(shape, best={"BV": 32, "num_warps": 8, "num_stages": 2, "maxnreg": None})
    own["key"].update(gpu=h100["gpu"])
    tuned.save_entry(tmp_path, own)
    assert _tuned(shape, "flag", h100, tmp_path)[1] == "tuned: state[BV=32 w=8 s=2 r=none]"


def test_a_path_choice_weighs_one_gpus_times(tmp_path, monkeypatch):
    """A choice between forms takes this GPU's own times where it has them all, else the borrowed ones alone:
    never an own time against a borrowed one."""
    h100 = {**ENV, "gpu": "NVIDIA H100 80GB HBM3"}
    shape = _kda_shape()
    save = _saver(tmp_path, shape)
    for kernel, t in (("kda_state_out", 600.0), ("state", 400.0), ("output", 350.0)):  # the H200's
        save(kernel, t)
    assert tuned.kda_one_pass_choice(shape, "flag", h100, tmp_path) == (
        True, "kda_state_out 600.0 us vs state + output 750.0 us")
    own = _entry(shape)  # the H100 searched its state kernel again: 100 us
    own["key"].update(gpu=h100["gpu"])
    own["best"]["time_us"] = 100.0
    tuned.save_entry(tmp_path, own)
    assert tuned.kda_one_pass_choice(shape, "flag", h100, tmp_path) == (  # not 600 against 100 + 350
        True, "kda_state_out 600.0 us vs state + output 750.0 us")
    monkeypatch.setenv(tuned.DISABLE_ENV, "own")
    assert tuned.kda_one_pass_choice(shape, "flag", h100, tmp_path) == (False, "no tuned kda_state_out")
    monkeypatch.delenv(tuned.DISABLE_ENV)
    for kernel, t in (("kda_state_out", 500.0), ("output", 300.0)):  # its own times complete: they decide
        e = _entry(shape, kernel=kernel)
        e["key"].update(gpu=h100["gpu"])
        e["best"]["time_us"] = t
        tuned.save_entry(tmp_path, e)
    assert tuned.kda_one_pass_choice(shape, "flag", h100, tmp_path) == (
        False, "kda_state_out 500.0 us vs state + output 400.0 us")


def test_cache_summary_counts_own_and_borrowable_entries(tmp_path, monkeypatch):
    h100 = {**ENV, "gpu": "NVIDIA H100 80GB HBM3"}
    shape = _shape()
    tuned.save_entry(tmp_path, _entry(shape))
    tuned.save_entry(tmp_path, _entry(shape, kernel="gram"))
    other = _entry(shape)
    other["key"].update(B200)
    tuned.save_entry(tmp_path, other)
    assert tuned.cache_summary(h100, tmp_path) == "0 for NVIDIA H100 80GB HBM3; borrows from NVIDIA H200 (2)"
    assert tuned.cache_summary(ENV, tmp_path) == "2 for NVIDIA H200"
    assert tuned.cache_summary(B200, tmp_path) == "1 for NVIDIA B200"
    assert tuned.cache_summary(None, tmp_path) == "none (no GPU)"
    monkeypatch.setenv(tuned.DISABLE_ENV, "own")
    assert tuned.cache_summary(h100, tmp_path) == "0 for NVIDIA H100 80GB HBM3"
    monkeypatch.setenv(tuned.DISABLE_ENV, "0")
    assert tuned.cache_summary(h100, tmp_path) == "off (GDNBENCH_TUNED=0)"


def _saver(tmp_path, shape):
    """save(kernel, time_us, variant="plain"): a cache entry of ``kernel`` on ``shape`` whose best took time_us."""
    def save(kernel, t, variant="plain"):
        e = _entry(shape, kernel=kernel, variant=variant)
        e["best"]["time_us"] = t
        tuned.save_entry(tmp_path, e)
    return save


def _fill(choice, off, shape, tmp_path, times):
    """Save each (kernel, best us) of ``times`` in turn, checking first that ``choice`` answers ``off`` (its
    "not chosen" value) and names that kernel's entry as the one missing; return the saver."""
    save = _saver(tmp_path, shape)
    for kernel, t in times:
        assert choice(shape, "flag", ENV, tmp_path) == (off, f"no tuned {kernel}")
        save(kernel, t)
    return save


def test_in_loop_choice_times_the_loop_against_the_pair_it_replaces(tmp_path):
    shape = _shape()
    save = _fill(tuned.in_loop_choice, None, shape, tmp_path, [("fused_out", 300.0), ("state_out", 250.0),
                                                            ("wu", 100.0)])
    assert tuned.in_loop_choice(shape, "flag", ENV, tmp_path) == ("wu", "fused_out 300.0 us vs state_out + wu 350.0 us")
    assert tuned.in_loop_choice(shape, "explicit", ENV, tmp_path)[0] == "wu"  # the same (plain) kernels
    assert tuned.in_loop_choice(shape, "fused_q", ENV, tmp_path) == (None, "no tuned fused_out")  # its own variants
    save("fused_out", 360.0)
    assert tuned.in_loop_choice(shape, "flag", ENV, tmp_path)[0] is None
    assert tuned.in_loop_choice(shape, "flag", None, tmp_path) == (None, "")
    assert tuned.in_loop_choice(shape, "flag", B200, tmp_path)[0] is None
    assert tuned.in_loop_choice(_kda_shape(), "flag", ENV, tmp_path) == (None, "")


def test_aqk_is_timed_writing_quads_where_the_fused_qk_loop_reads_it(tmp_path, monkeypatch):
    """aqk's fused_qk candidates write the quad tile when the forward they belong to would: the in-loop form chosen
    and its loop's entry reading k's rstd from the tile."""
    shape = _shape()

    def save(kernel, t, best=None):
        e = _entry(shape, kernel=kernel, variant=tuned.variant_of(kernel, "fused_qk"), best=best)
        e["best"]["time_us"] = t
        tuned.save_entry(tmp_path, e)

    loop = {"k_rstd_tile": True, "early_beta": False, "BK": 64, "BV": 64, "segments": 1, "split_v": False,
            "num_warps": 4, "num_stages": 2, "maxnreg": None}
    save("state_out", 250.0, {"BK": 64, "BV": 64, "num_warps": 4, "num_stages": 2, "maxnreg": None})
    save("wu", 100.0, {"BK": 64, "BV": 64, "num_warps": 4, "num_stages": 2, "maxnreg": None})
    assert not tuned.loop_reads_k_tile(shape, "fused_qk", ENV, tmp_path)  # no loop entry: no in-loop form
    save("fused_out", 300.0, loop)
    assert tuned.loop_reads_k_tile(shape, "fused_qk", ENV, tmp_path)
    assert not tuned.loop_reads_k_tile(shape, "fused_q", ENV, tmp_path)
    assert not tuned.loop_reads_k_tile(shape, "fused_qk", None, tmp_path)
    # the worker asks per route: an earlier variant's search (fused_q: no tile) leaves fused_qk's answer alone
    monkeypatch.setattr(at_bench, "device_env", lambda: ENV)
    worker = at_bench._Bench.__new__(at_bench._Bench)
    worker.kda, worker.device, worker.shape, worker.cache_dir, worker._k_tile = False, "cuda", shape, tmp_path, {}
    assert [worker.aqk_writes_k_tile(r) for r in ("plain", "fused_q", "fused_qk")] == [False, False, True]
    save("fused_out", 300.0, {**loop, "k_rstd_tile": False})
    assert not tuned.loop_reads_k_tile(shape, "fused_qk", ENV, tmp_path)
    save("fused_out", 400.0, loop)  # slower than the pair it replaces: not the form that runs
    assert not tuned.loop_reads_k_tile(shape, "fused_qk", ENV, tmp_path)


def test_gdnbench_runs_the_in_loop_form_where_it_was_timed_faster(monkeypatch):
    import dataclasses

    from gdnbench.backends import gdnbench as gb
    from gdnbench.kernels.config import default_config

    shape = _shape()
    one = dataclasses.replace(default_config(128, 128, 2), one_pass=True)
    monkeypatch.setattr(tuned, "in_loop_choice", lambda *a: ("wu", "fused_out 1.0 us vs state_out + wu 2.0 us"))
    won = tuned.Winners({"wu": {"num_warps": 4}})
    cfg, note = gb._in_loop(shape, "flag", ENV, one, won)
    assert cfg == dataclasses.replace(one, in_loop="wu")
    assert note == ", in loop: wu (fused_out 1.0 us vs state_out + wu 2.0 us)"
    two = dataclasses.replace(one, one_pass=False)
    assert gb._in_loop(shape, "flag", ENV, two, won) == (two, "")  # the two-kernel path has no such loop
    assert gb._in_loop(shape, "flag", None, one, won) == (one, "")  # no machine, no tuned times
    monkeypatch.setattr(tuned, "in_loop_choice", lambda *a: (None, "fused_out 3.0 us vs state_out + wu 2.0 us"))
    assert gb._in_loop(shape, "flag", ENV, one, won) == (one, "")  # the loop has no winner: nothing to explain
    assert gb._in_loop(shape, "flag", ENV, one, tuned.Winners({"fused_out": {"num_warps": 4}})) == (
        one, "; in-loop form not taken (fused_out 3.0 us vs state_out + wu 2.0 us)")


def test_kda_one_pass_choice_times_it_against_state_and_output(tmp_path, monkeypatch):
    import dataclasses

    from gdnbench.backends import gdnbench as gb
    from gdnbench.kernels.config import default_config

    shape = _kda_shape()
    save = _fill(tuned.kda_one_pass_choice, False, shape, tmp_path, [("kda_state_out", 600.0), ("state", 400.0),
                                                                     ("output", 350.0)])
    assert tuned.kda_one_pass_choice(shape, "flag", ENV, tmp_path) == (
        True, "kda_state_out 600.0 us vs state + output 750.0 us")
    assert tuned.kda_one_pass_choice(shape, "fused_q", ENV, tmp_path) == (False, "no tuned kda_state_out")
    save("kda_state_out", 800.0)
    assert tuned.kda_one_pass_choice(shape, "flag", ENV, tmp_path)[0] is False
    assert tuned.kda_one_pass_choice(_shape(), "flag", ENV, tmp_path) == (False, "")  # GDN has its own one pass
    assert tuned.kda_one_pass_choice(shape, "flag", None, tmp_path) == (False, "")
    # the backend takes the one pass where it was timed faster, and says why
    base = default_config(128, 128, 2, "kda")
    monkeypatch.setattr(tuned, "kda_one_pass_choice", lambda *a: (True, "kda_state_out 1.0 us vs state + output 2.0 us"))
    monkeypatch.setattr(tuned, "kda16_choice", lambda *a: (False, "no tuned kda16_prep"))
    none = tuned.Winners()
    assert gb._kda_forms(shape, "flag", ENV, base, none) == (
        dataclasses.replace(base, one_pass=True), "; one pass (kda_state_out 1.0 us vs state + output 2.0 us)")
    assert gb._kda_forms(shape, "flag", None, base, none) == (base, "")
    assert gb._kda_forms(_shape(), "flag", ENV, base, none) == (base, "")
    monkeypatch.setattr(tuned, "kda16_choice", lambda *a: (True, "why"))  # and the 16-token tiles too
    assert gb._kda_forms(shape, "flag", ENV, base, none) == (
        dataclasses.replace(base, one_pass=True, kda_chunk16=True),
        "; one pass (kda_state_out 1.0 us vs state + output 2.0 us); 16-token tiles (why)")
    # a form not taken whose kernels have tuned winners: the notes say why (the row's label lists only what ran)
    monkeypatch.setattr(tuned, "kda_one_pass_choice", lambda *a: (False, ""))
    monkeypatch.setattr(tuned, "kda16_choice", lambda *a: (False, "no tuned kda16_loop"))
    won = tuned.Winners({"wu": {"num_warps": 4}, "kda16_prep": {"BK": 32}})
    assert gb._kda_forms(shape, "flag", ENV, base, won) == (base, "; 16-token tiles not taken (no tuned kda16_loop)")
    assert gb._kda_forms(shape, "flag", ENV, base, tuned.Winners({"wu": {"num_warps": 4}})) == (base, "")
    assert gb._not_taken(tuned.Winners({"kda_state_out": {}}), ("state",), "x", "why") == ""


def test_a_rows_label_lists_the_winners_of_the_kernels_that_run(tmp_path, monkeypatch):
    """The 16-token form taken: the row's label lists its two kernels' winners, not those of the kernels it
    replaced; without it, the five kernels' and not the form's."""
    import dataclasses

    from gdnbench.backends import gdnbench as gb
    from gdnbench.kernels import cache_key as ck
    from gdnbench.kernels.config import default_config

    gpu = {"gpu": "Fake GPU", "compute_capability": "8.0", "triton": "3.6.0"}
    monkeypatch.setenv("GDNBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ck, "device_env", lambda: gpu)
    shape = _kda_shape()
    base = default_config(128, 128, 2, "kda")

    def save(kernel, t):  # a winner: the default at a register cap of 128
        e = _entry(shape, kernel=kernel, best={**dataclasses.asdict(getattr(base, kernel)), "maxnreg": 128})
        e["key"].update(gpu)
        e["best"]["time_us"] = t
        tuned.save_entry(tmp_path / "tuned", e)

    for kernel, t in (("kda16_prep", 300.0), ("kda16_loop", 900.0), ("kda_intra", 600.0), ("wu", 380.0),
                      ("state", 420.0), ("output", 360.0)):
        save(kernel, t)
    cfg, label = gb.GdnbenchBackend()._config(shape, "flag", "cuda")
    assert cfg.kda_chunk16 and label.startswith("tuned: kda16_prep[") and ", kda16_loop[" in label
    assert "state[" not in label and label.endswith("; 16-token tiles (kda16_prep + kda16_loop 1200.0 us vs "
                                                   "kda_intra + wu + state + output 1760.0 us)")
    save("kda16_loop", 2000.0)
    cfg, label = gb.GdnbenchBackend()._config(shape, "flag", "cuda")
    assert not cfg.kda_chunk16 and "kda16" not in label.split(";")[0] and label.startswith("tuned: kda_intra[")
    assert "; 16-token tiles not taken (kda16_prep + kda16_loop 2300.0 us vs" in label


def test_a_forced_forms_label_lists_its_own_kernels_and_their_lender(tmp_path, monkeypatch):
    """gdnbench-kda16 runs the 16-token tiles where gdnbench would not: its label lists those two kernels'
    winners, borrowed from another GPU of the same compute capability, and says so."""
    import dataclasses

    from gdnbench.backends.gdnbench_kda16 import GdnbenchKda16Backend
    from gdnbench.kernels import cache_key as ck
    from gdnbench.kernels.config import default_config

    lender = {"gpu": "Fake GPU", "compute_capability": "8.0", "triton": "3.6.0"}
    monkeypatch.setenv("GDNBENCH_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(ck, "device_env", lambda: {**lender, "gpu": "Other GPU"})
    shape = _kda_shape()
    base = default_config(128, 128, 2, "kda")
    for kernel, t in (("kda16_prep", 300.0), ("kda16_loop", 2000.0), ("kda_intra", 600.0), ("wu", 380.0)):
        e = _entry(shape, kernel=kernel, best={**dataclasses.asdict(getattr(base, kernel)), "maxnreg": 128})
        e["key"].update(lender)
        e["best"]["time_us"] = t
        tuned.save_entry(tmp_path / "tuned", e)
    cfg, label = GdnbenchKda16Backend()._config(shape, "flag", "cuda")
    assert cfg.kda_chunk16 and cfg.kda16_prep.maxnreg == 128 and cfg.wu.maxnreg == 128
    assert label.startswith("tuned: kda16_prep[") and ", kda16_loop[" in label and "wu[" not in label
    assert label.endswith("; tuned on Fake GPU (none here): kda16_prep, kda16_loop; kda_chunk16")


def test_kda16_choice_times_its_two_kernels_against_the_ones_they_replace(tmp_path):
    import dataclasses

    shape = _kda_shape()
    save = _fill(tuned.kda16_choice, False, shape, tmp_path, [("kda16_prep", 300.0), ("kda16_loop", 900.0),
                                                              ("kda_intra", 600.0), ("wu", 380.0), ("state", 420.0),
                                                              ("output", 360.0)])
    assert tuned.kda16_choice(shape, "flag", ENV, tmp_path) == (
        True, "kda16_prep + kda16_loop 1200.0 us vs kda_intra + wu + state + output 1760.0 us")
    save("kda_state_out", 100.0)  # the one pass is chosen (100 < 780): the form is timed against it
    assert tuned.kda16_choice(shape, "flag", ENV, tmp_path) == (
        False, "kda16_prep + kda16_loop 1200.0 us vs kda_intra + wu + kda_state_out 1080.0 us")
    # fused_qk: its prepare and loop variants are timed; the replaced kernels it has no entry for take flag's
    assert tuned.kda16_choice(shape, "fused_qk", ENV, tmp_path) == (False, "no tuned kda16_prep")
    save("kda16_prep", 320.0, "fused_qk")  # the loop is flag's
    assert tuned.kda16_choice(shape, "fused_qk", ENV, tmp_path) == (
        True, "kda16_prep + kda16_loop 1220.0 us vs kda_intra + wu + state + output_fused 1760.0 us")
    save("kda_intra", 50.0, "fuse_k")
    save("wu", 10.0, "fuse_k")
    assert tuned.kda16_choice(shape, "fused_qk", ENV, tmp_path) == (
        False, "kda16_prep + kda16_loop 1220.0 us vs kda_intra + wu + state + output_fused 840.0 us")
    assert tuned.kda16_choice(dataclasses.replace(shape, lower_bound=None), "flag", ENV, tmp_path) == (False, "")
    assert tuned.kda16_choice(_shape(), "flag", ENV, tmp_path) == (False, "")
    assert tuned.kda16_choice(shape, "flag", None, tmp_path) == (False, "")


def test_tuned_winners_apply_kda_entries(tmp_path):
    from gdnbench.kernels.config import KernelConfig, default_config

    kda, gdn = _kda_shape(), _shape()
    best = {"BK": 64, "num_warps": 4, "num_stages": 2, "maxnreg": 200}
    e = _entry(kda, kernel="kda_intra", variant="fuse_k", best=best)
    e["default"]["config"] = {"BK": 32, "num_warps": 2, "num_stages": 1, "maxnreg": None}
    tuned.save_entry(tmp_path, e)
    tuned.save_entry(tmp_path, _entry(kda))  # state, plain: KDA's state runs it on fused_qk too
    cfg, label = _tuned(kda, "fused_qk", ENV, tmp_path)
    assert cfg.kda_intra == KernelConfig(**best) and cfg.state.maxnreg == 128
    assert label == "tuned: kda_intra[BK=64 w=4 s=2 r=200], state[BV=64 w=4 s=3 r=128]"
    assert cfg.wu == default_config(128, 128, 2, "kda").wu  # untouched kernels: the KDA default
    assert _tuned(kda, "flag", ENV, tmp_path)[1] == "tuned: state[BV=64 w=4 s=3 r=128]"  # plain kda_intra
    # a GDN shape of the same sizes has another key: KDA entries never reach it
    assert _tuned(gdn, "flag", ENV, tmp_path)[1] == "default"
    # a KDA winner that breaks KDA's shared-memory rule is refused, with a warning
    bad = _entry(kda, kernel="kda_intra", variant="plain", best={**best, "BK": 128, "num_stages": 4})
    tuned.save_entry(tmp_path, bad)
    with pytest.warns(tuned.StaleEntry, match="invalid"):
        assert _tuned(kda, "flag", ENV, tmp_path)[1] == "default"


def test_stale_source_hash_is_ignored_with_a_warning(tmp_path):
    shape = _shape()
    tuned.save_entry(tmp_path, _entry(shape, source_hash="sha256:old"))
    with pytest.warns(tuned.StaleEntry, match="source hash changed"):
        cfg, label = _tuned(shape, "flag", ENV, tmp_path)
    assert label == "default" and cfg == _tuned(shape, "flag", None, tmp_path)[0]
    rows = at_report.report_rows(tmp_path)
    assert rows[0]["stale"] is True


def test_stale_kernels_names_the_kernels_that_run_untuned(tmp_path, monkeypatch):
    from gdnbench.backends import gdnbench as gb

    shape = _shape()
    tuned.save_entry(tmp_path, _entry(shape, source_hash="sha256:old"))
    assert tuned.stale_kernels(shape, "flag", ENV, tmp_path) == ["state[plain]"]
    assert tuned.stale_kernels(shape, "flag", None, tmp_path) == []  # no machine, nothing looked up
    monkeypatch.setenv(tuned.DISABLE_ENV, "0")
    assert tuned.stale_kernels(shape, "flag", ENV, tmp_path) == []  # the cache is off: nothing was ignored
    monkeypatch.delenv(tuned.DISABLE_ENV)
    tuned.save_entry(tmp_path, _entry(shape))  # the search again: a current entry replaces the stale one
    assert tuned.stale_kernels(shape, "flag", ENV, tmp_path) == []
    # the row's config says so
    monkeypatch.setattr(tuned, "stale_kernels", lambda *a: ["kda16_prep[plain]", "state[plain]"])
    assert gb._with_stale(shape, "flag", ENV, "tuned: x") == (
        "tuned: x; stale tuned entries ignored: kda16_prep[plain], state[plain]")
    monkeypatch.setattr(tuned, "stale_kernels", lambda *a: [])
    assert gb._with_stale(shape, "flag", ENV, "tuned: x") == "tuned: x"


def test_winner_equal_to_default_keeps_default(tmp_path):
    shape = _shape()
    e = _entry(shape)
    e["best"] = dict(e["default"])
    tuned.save_entry(tmp_path, e)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _tuned(shape, "flag", ENV, tmp_path)[1] == "default"


def test_report_and_chart(tmp_path):
    shape = _shape()
    e = _entry(shape)
    tuned.save_entry(tmp_path, e)
    rows = at_report.report_rows(tmp_path)
    assert len(rows) == 1 and rows[0]["ratio"] == pytest.approx(0.75) and "r=128" in rows[0]["winner"]
    assert rows[0]["stale"] is False
    table = at_report.report_table(tmp_path)
    assert table.rows[0][6] == "0.750"
    png = at_report.chart(e, tmp_path / "state.png")
    assert png.exists() and png.stat().st_size > 1000


def test_make_entry_records_failures(tmp_path):
    shape = _shape(K=32, V=32, dtype="float32")
    space = at_space.build_space("gram", 32, 32, "float32")

    def fn(p):
        if p["maxnreg"] == 64:
            return {"status": "compile_error", "reason": "ptxas: too few registers", "time_us": None}
        return {"status": "ok", "reason": "", "time_us": 10.0 + (p["maxnreg"] or 300) / 100}

    res = at_search.search(space, at_plan.per_candidate(fn), budget_s=1e9, exhaustive_max=0)
    opts = at_plan.TuneOptions(cache_dir=tmp_path)
    entry = at.make_entry(ENV, at_plan.Task("gram", "plain", "flag"), shape, "smoke", space, res, opts)
    assert entry["search"]["failed"] >= 1
    assert any(c["status"] == "compile_error" for c in entry["candidates"])
    assert entry["best"]["time_us"] < entry["default"]["time_us"]
    tuned.save_entry(tmp_path, entry)
    assert _tuned(shape, "flag", ENV, tmp_path)[1].startswith("tuned: gram[")


# ----------------------------------------------------------------------------- CLI
def _app():
    from gdnbench.cli.autotune import register

    app = typer.Typer(add_completion=False)

    @app.callback()
    def root():
        """test app"""

    register(app)
    return app


def test_dry_run_cli_prints_dimensions_and_counts():
    r = CliRunner().invoke(_app(), ["autotune", "--dry-run", "--shapes", "smoke", "--kernels", "gram,state",
                                    "--routes", "flag"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "gram variant=plain route=flag gdn_K32_V32_H2_HV4_float32_fixed_T256" in r.output
    assert "maxnreg: none,64..248 step 8" in r.output and "num_warps: 1,2,4,8,16" in r.output
    assert "candidates" in r.output and "valid" in r.output
    # the smoke set's KDA shapes run state, not gram
    assert "state variant=plain route=flag kda_K32_V32_H2_HV2_float32_fixed_T128 (kda_fixed)" in r.output
    assert "gram variant=plain route=flag kda_" not in r.output
    r = CliRunner().invoke(_app(), ["autotune", "--dry-run", "--shapes", "smoke", "--kernels", "gram"],
                           env={"COLUMNS": "200"})
    assert r.exit_code == 0 and "2 kda shape(s) left out: --kernels gram are not run by kda" in r.output


@pytest.mark.parametrize("args, words", [
    (["--kernels", "nope"], "unknown value 'nope'"),
    (["--routes", "sideways"], "unknown value 'sideways'"),
    (["--family", "mamba"], "--family"),
    (["--shapes", "no-such-set"], "no shape set 'no-such-set'"),
    (["--device", "tpu"], "--device"),
    (["--nproc-per-node", "0"], "--nproc-per-node"),
    (["--compile-workers", "-1"], "--compile-workers -1: use a value of at least 0"),
    (["--timeout", "-1"], "--timeout -1.0: use a value of at least 1"),
    (["--check-tokens", "0"], "--check-tokens 0: use a value of at least 1"),
    (["--warmup", "-2"], "--warmup -2: use a value of at least 0"),
    (["--shard", "rows"], "--shard 'rows'"),
])
def test_bad_input_is_one_line_exit_2(args, words):
    r = CliRunner().invoke(_app(), ["autotune", "--dry-run", *args], env={"COLUMNS": "200"})
    assert r.exit_code == 2 and words in r.output and "Traceback" not in r.output


def test_dry_run_lists_kda_searches_for_kda_legacy6():
    r = CliRunner().invoke(_app(), ["autotune", "--dry-run", "--shapes", "kda-legacy6", "--family", "kda"],
                           env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    key = "kda_K128_V128_H96_HV96_bfloat16_fixed_T8192 (h96_fixed)"
    for search in ("kda_intra variant=plain route=flag", "kda_intra variant=fuse_k route=fused_qk",
                   "wu variant=fuse_k route=fused_qk", "state variant=plain route=flag",
                   "output_fused variant=fused_q route=fused_q"):
        assert f"{search} {key}" in r.output
    assert "gram variant" not in r.output and "state variant=fuse_k" not in r.output
    # 4 shape keys (the mixed and uniform sets of a head count share one) x 14 specializations (10, and the
    # 16-token form's prepare kernel per norm variant and its one loop)
    assert "56 searches, nothing run" in r.output and "output_fused variant=fused_qk" not in r.output
    assert f"kda16_loop variant=plain route=flag {key}" in r.output
    # --family selects shapes by family: no gdn shape in kda-legacy6, no kda shape with --family gdn
    r = CliRunner().invoke(_app(), ["autotune", "--dry-run", "--shapes", "kda-legacy6", "--family", "gdn"])
    assert r.exit_code == 2 and "no gdn shapes selected in kda-legacy6" in r.output
    r = CliRunner().invoke(_app(), ["autotune", "--dry-run", "--shapes", "smoke", "--family", "gdn"],
                           env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "gdn_K32" in r.output and "kda_" not in r.output


def test_config_label_default_on_cpu():
    from gdnbench.backends import get

    b = get("gdnbench")
    assert b.config_label(_shape(), "flag", "cpu") in ("default; one pass", "default; two kernels")
    assert get("reference").config_label(_shape(), "flag", "cpu") == "default"


class _ScriptClient(at_worker.WorkerClient):
    """A WorkerClient whose worker is a tiny script: ready, then it dies on the second request."""

    SCRIPT = ("import sys, json, os\n"
              "print(json.dumps({'_end': {'ready': True, 'env': {'gpu': 'fake'}}}), flush=True)\n"
              "for n, line in enumerate(sys.stdin):\n"
              "    if n == 1:\n"
              "        sys.stderr.write('an illegal memory access was encountered\\n'); sys.stderr.flush(); os._exit(17)\n"
              "    print(json.dumps({'_end': {'status': 'ok', 'reason': '', 'time_us': 1.0}}), flush=True)\n")

    def command(self):
        import sys

        return [sys.executable, "-c", self.SCRIPT]


def test_crashing_worker_costs_one_candidate_and_restarts():
    client = _ScriptClient({}, "cpu", timeout_s=30)
    try:
        results, _ = at_plan.per_candidate(lambda p: client.evaluate("gram", "flag", p))([{"i": i} for i in range(4)])
    finally:
        client.close()
    assert [r["status"] for r in results] == ["ok", "crashed", "ok", "crashed"]
    assert "exit code 17" in results[1]["reason"] and "illegal memory access" in results[1]["reason"]


def test_report_cli_prints_the_cache_and_charts(tmp_path):
    """--report reads the committed H200 cache (tuned on the GPU); --plot draws one chart per entry, of the
    --kernels given."""
    from gdnbench.cli.app import app

    res = CliRunner().invoke(app, ["autotune", "--report"], env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "output_fused" in res.output and "fused_out" in res.output and "nvidia-h200" in res.output
    res = CliRunner().invoke(app, ["autotune", "--report", "--plot", str(tmp_path), "-k", "kda16_loop"],
                             env={"COLUMNS": "250"})
    assert res.exit_code == 0, res.output
    assert "kda16_loop" in res.output and "output_fused" not in res.output
    charts = list(tmp_path.glob("*.png"))
    assert len(charts) >= 2 and all("_kda16_loop_" in p.name for p in charts)
    empty = CliRunner().invoke(app, ["autotune", "--report", "--cache-dir", str(tmp_path / "none")])
    assert empty.exit_code == 2 and "no tuning cache entries" in empty.output
    bad = CliRunner().invoke(app, ["autotune", "--report", "-k", "nope"])
    assert bad.exit_code == 2 and "--kernels: unknown value 'nope'" in bad.output


# ----------------------------------------------------------------------------- real candidates on the CPU
def _smoke_client(shape_id):
    spec = {"shape_set": str(shp.load("smoke").path), "shape_id": shape_id, "device": "cpu", "check_tokens": 64,
            "params": {"warmup": 0, "rounds": 1, "iters": 1}}
    return at_worker.WorkerClient(spec, "cpu", timeout_s=300, start_timeout_s=300)


def test_kda_candidates_evaluate_in_a_cpu_worker():
    """The KDA stage chain of the worker (kda_intra's Aqk into the output kernel, w/u's kg into the
    state kernel, raw q under the fused routes): non-default points pass the gate and are timed."""
    client = _smoke_client("kda_packed_gva2")  # varlen, GVA, initial state
    try:
        for kernel, route, point in (
                ("kda_intra", "fused_qk", {"BK": 16, "num_warps": 4, "num_stages": 2, "maxnreg": None}),
                ("state", "flag", {"BV": 16, "num_warps": 2, "num_stages": 1, "maxnreg": None}),
                ("output_fused", "fused_q", {"BK": 16, "BV": 16, "num_warps": 2, "num_stages": 2, "maxnreg": 128})):
            r = client.evaluate(kernel, route, point)
            assert r["status"] == "ok", r
            assert r["time_us"] > 0 and r["err_vs_default"] < 1e-5 and r["err_o"] <= r["budget_o"]
    finally:
        client.close()


def test_gdn_one_pass_candidates_evaluate_in_a_cpu_worker():
    """GDN's one-pass kernels under every route's specialization: aqk (q's rstd under FUSE_Q) feeds
    state_out in the worker's stage chain, and non-default points pass the gate and are timed."""
    client = _smoke_client("gdn_packed_gva3")  # varlen, GVA 3, fp16
    try:
        for kernel in ("aqk", "state_out", "fused_out"):
            for route in ("flag", "fused_q", "fused_qk"):
                point = {"BK": 16, "num_warps": 2, "num_stages": 1, "maxnreg": None}
                if kernel != "aqk":
                    point["BV"] = 16
                r = client.evaluate(kernel, route, point)
                assert r["status"] == "ok", (kernel, route, r)
                assert r["time_us"] > 0 and r["err_vs_default"] < 1e-3 and r["err_o"] <= r["budget_o"]
    finally:
        client.close()


def test_autotune_cli_tunes_kda_on_the_cpu(tmp_path):
    """`gdnbench autotune --family kda` end to end on the CPU: a worker per shape, one search per KDA
    specialization (budget 0: the default point only), entries under KDA shape keys."""
    args = ["autotune", "--device", "cpu", "--shapes", "smoke", "--shape-id", "kda_fixed,gdn_fixed_b2",
            "--family", "kda", "--kernels", "kda_intra,state", "--routes", "fused_qk", "--budget", "0",
            "--warmup", "0", "--rounds", "1", "--iters", "1", "--check-tokens", "64", "--cache-dir", str(tmp_path)]
    r = CliRunner().invoke(_app(), args, env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "2 searches written" in r.output
    kda = shp.load("smoke").get("kda_fixed")
    for kernel, variant in (("kda_intra", "fuse_k"), ("state", "plain")):
        [e] = tuned.load_entries(tuned.cache_path(tmp_path, "cpu", kernel))
        assert e["key"]["shape_key"] == cache_key.shape_key(kda) and e["variant"] == variant
        assert e["default"]["time_us"] > 0 and e["candidates"][0]["status"] == "ok"
        assert e["gate"].startswith("whole chunk_kda forward")


# ----------------------------------------------------------------------------- resume
class _FakeWorker:
    """Stands in for WorkerClient in tune(): starts at once, answers every candidate ok; raises
    KeyboardInterrupt at the first candidate of kernel ``interrupt_on`` (a SIGINT mid-search)."""

    def __init__(self, spec, *args, env=ENV, interrupt_on=None, started=None):
        self.spec, self.env, self.interrupt_on = spec, env, interrupt_on
        self.started = started if started is not None else []
        self.last_error = ""
        self.n = 0

    def ensure_started(self):
        self.started.append(self.spec["shape_id"])
        return self.env

    def evaluate(self, kernel, route, point):
        if kernel == self.interrupt_on:
            raise KeyboardInterrupt
        self.n += 1
        return {"status": "ok", "reason": "", "time_us": 100.0 + self.n}

    def close(self):
        pass


def _smoke_pairs(*ids):
    ss = shp.load("smoke")
    return [(str(ss.path), ss.get(i)) for i in ids]


def _tune(tmp_path, kernels, retune=False, only=(), **fake):
    """tune() over smoke's gdn_fixed_b2 on the flag route with fake workers: (events, shapes started)."""
    events, started = [], []
    opts = at_plan.TuneOptions(device="cpu", budget_s=0, cache_dir=tmp_path, retune=retune, only=only)
    at.tune(_smoke_pairs("gdn_fixed_b2"), at_plan.plan_tasks(["flag"], kernels), opts,
            on_event=lambda kind, info: events.append((kind, info)), env=ENV,
            client_factory=lambda spec: _FakeWorker(spec, started=started, **fake))
    return events, started


def _searched(events):
    return [info["task"].kernel for kind, info in events if kind == "entry"]


def test_tune_skips_current_cache_entries_and_searches_stale_ones(tmp_path):
    shape = _smoke_pairs("gdn_fixed_b2")[0][1]
    tuned.save_entry(tmp_path, _entry(shape, kernel="state"))
    tuned.save_entry(tmp_path, _entry(shape, kernel="output", source_hash="sha256:old"))
    failed = _entry(shape, kernel="gram")
    failed["best"] = None  # its search found no working config: searched again
    tuned.save_entry(tmp_path, failed)
    events, started = _tune(tmp_path, ["gram", "state", "output"])
    [(kind, info)] = [(k, i) for k, i in events if k == "cached"]
    assert info["task"].kernel == "state"
    assert info["reason"] == "cached: BV=64 w=4 s=3 r=128: 120.0 µs, default 160.0 µs"
    assert _searched(events) == ["gram", "output"] and started == ["gdn_fixed_b2"]
    tally = at_report.Tally()
    for kind, info in events:
        tally.count(kind, info)
    assert (tally.run, tally.skipped, tally.failed, tally.written) == (2, 1, 0, 2) and tally.search_s > 0
    # the stale entry was replaced: everything is cached now, and no worker starts
    events, started = _tune(tmp_path, ["gram", "state", "output"])
    assert [k for k, _ in events] == ["cached"] * 3 and started == []


def test_retune_searches_cached_entries_again(tmp_path):
    shape = _smoke_pairs("gdn_fixed_b2")[0][1]
    tuned.save_entry(tmp_path, _entry(shape, kernel="state"))
    events, started = _tune(tmp_path, ["state"], retune=True)
    assert _searched(events) == ["state"] and not any(k == "cached" for k, _ in events)
    [e] = tuned.load_entries(tuned.cache_path(tmp_path, ENV["gpu"], "state"))
    assert e["candidates"][0]["time_us"] == 101.0  # the new search replaced the old entry


def test_only_searches_the_named_dimensions_from_the_cached_winner(tmp_path):
    shape = _smoke_pairs("gdn_fixed_b2")[0][1]
    won = {"BK": 64, "BV": 64, "num_warps": 2, "num_stages": 2, "maxnreg": 128}
    tuned.save_entry(tmp_path, _entry(shape, kernel="state", best=won))
    events, _ = _tune(tmp_path, ["state"], retune=True, only=("maxnreg", "num_stages"))
    [entry] = [info["entry"] for kind, info in events if kind == "entry"]
    default = entry["default"]["config"]
    moved = [c["config"] for c in entry["candidates"] if c["config"] != default]
    assert moved and all({k: v for k, v in c.items() if k not in ("maxnreg", "num_stages")}
                         == {k: v for k, v in won.items() if k not in ("maxnreg", "num_stages")} for c in moved)
    assert {c["maxnreg"] for c in moved} == set(at_space.MAXNREG_VALUES) and len({c["num_stages"] for c in moved}) > 1
    assert entry["search"]["only"] == ["maxnreg", "num_stages"] and entry["search"]["strategy"] == "exhaustive"
    assert entry["search"]["dims"]["num_warps"] == [2] and entry["search"]["dims"]["BV"] == [64]


def test_only_must_name_a_dimension_of_the_selected_kernels():
    r = CliRunner().invoke(_app(), ["autotune", "--dry-run", "--device", "cpu", "-s", "smoke", "-k", "state", "-r", "flag",
                                 "--only", "maxnreg,segments"], env=_cli_env())
    assert r.exit_code == 2 and "--only segments: not a dimension of --kernels state" in r.output
    r = CliRunner().invoke(_app(), ["autotune", "--dry-run", "--device", "cpu", "-s", "smoke", "--shape-id", "gdn_fixed_b2",
                                 "-k", "state", "-r", "flag", "--only", "maxnreg"], env=_cli_env())
    assert r.exit_code == 0 and "25 candidates" in r.output, r.output


def test_interrupted_sweep_keeps_finished_entries(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        _tune(tmp_path, ["state", "output"], interrupt_on="output")
    assert len(tuned.load_entries(tuned.cache_path(tmp_path, ENV["gpu"], "state"))) == 1
    assert tuned.load_entries(tuned.cache_path(tmp_path, ENV["gpu"], "output")) == []
    events, _ = _tune(tmp_path, ["state", "output"])  # the re-run resumes
    assert [k for k, _ in events if k in ("cached", "entry")] == ["cached", "entry"]


def _cli_env():
    return {"COLUMNS": "250"}


SMOKE_ARGS = ["--device", "cpu", "--shapes", "smoke", "--shape-id", "gdn_fixed_b2", "--kernels", "state,output",
              "--routes", "flag", "--budget", "0"]


def test_autotune_cli_interrupt_exits_130_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(at, "WorkerClient", lambda spec, *a: _FakeWorker(spec, env=at_bench.device_identity("cpu"),
                                                                          interrupt_on="output"))
    r = CliRunner().invoke(_app(), ["autotune", *SMOKE_ARGS, "--cache-dir", str(tmp_path)], env=_cli_env())
    assert r.exit_code == 130, r.output
    assert "Traceback" not in r.output
    [line] = [l for l in r.output.splitlines() if "interrupted" in l]
    assert "interrupted: 1 finished search(es) saved under" in line
    assert len(tuned.load_entries(tuned.cache_path(tmp_path, "cpu", "state"))) == 1


def test_autotune_cli_skips_cached_searches_and_prints_the_summary(tmp_path):
    env = at_bench.device_identity("cpu")
    shape = _smoke_pairs("gdn_fixed_b2")[0][1]
    for kernel in ("state", "output"):
        e = _entry(shape, kernel=kernel)
        e["key"] = cache_key.entry_key(env, kernel, shape, "plain")
        tuned.save_entry(tmp_path, e)
    r = CliRunner().invoke(_app(), ["autotune", *SMOKE_ARGS, "--cache-dir", str(tmp_path)], env=_cli_env())
    assert r.exit_code == 0, r.output
    assert "skipped state[plain] gdn_K32_V32_H2_HV4_float32_fixed_T256: cached: BV=64 w=4 s=3 r=128" in r.output
    assert "0 searches written under" in r.output
    assert "searches: 0 run, 2 skipped (cached), 0 failed; wall time " in r.output


def test_dry_run_marks_cached_searches(tmp_path):
    shape = _smoke_pairs("gdn_fixed_b2")[0][1]
    tuned.save_entry(tmp_path, _entry(shape, kernel="state"))  # current, on the H200
    tuned.save_entry(tmp_path, _entry(shape, kernel="state", gpu="NVIDIA B200", source_hash="sha256:old"))
    args = ["autotune", "--dry-run", "--shapes", "smoke", "--kernels", "state", "--routes", "flag",
            "--cache-dir", str(tmp_path)]
    r = CliRunner().invoke(_app(), args, env=_cli_env())
    assert r.exit_code == 0, r.output
    [line] = [l for l in r.output.splitlines() if "[cached on" in l]
    assert line.startswith("state variant=plain route=flag gdn_K32_V32_H2_HV4_float32_fixed_T256 (gdn_fixed_b2)")
    assert line.endswith("[cached on nvidia-h200: BV=64 w=4 s=3 r=128: 120.0 µs, default 160.0 µs]")
    assert "nvidia-b200" not in r.output and "4 searches, nothing run; 1 marked cached (under " in r.output
    r = CliRunner().invoke(_app(), [*args, "--retune"], env=_cli_env())
    assert r.exit_code == 0 and "cached" not in r.output and "4 searches, nothing run; valid" in r.output


def test_compile_pool_warms_every_point_in_parallel_and_survives_failures():
    import threading

    import time

    calls, running, peak = [], [0], [0]
    lock = threading.Lock()

    class FakeClient:
        def __init__(self, spec):
            assert spec["warm_only"] is True
            self.closed = False

        def evaluate(self, kernel, route, point, warm=False):
            assert warm
            with lock:
                calls.append(point["x"])
                running[0] += 1
                peak[0] = max(peak[0], running[0])
            time.sleep(0.05)
            with lock:
                running[0] -= 1
            if point["x"] == 3:
                return {"status": "crashed", "reason": "boom"}
            return {"status": "ok", "reason": ""}

        def close(self):
            self.closed = True

    pool = at_worker.CompilePool({"shape_id": "s"}, 3, FakeClient)
    res = pool.warm("output", "flag", [{"x": i} for i in range(7)])
    assert sorted(calls) == list(range(7)) and [r["status"] for r in res].count("crashed") == 1
    assert peak[0] == 3  # three workers compiling at once
    pool.close()
    assert all(c.closed for c in pool.clients)
    assert at_worker.CompilePool({}, 0, FakeClient).warm("output", "flag", [{"x": 1}]) == []
    assert at_dist.default_compile_workers("cpu") == 0
    assert 0 <= at_dist.default_compile_workers("cuda", 2) <= 8


def test_warm_request_compiles_a_candidate_in_a_cpu_worker():
    client = _smoke_client("kda_packed_gva2")
    client.spec["warm_only"] = True  # no oracle is built
    try:
        point = {"BK": 16, "BV": 16, "num_warps": 2, "num_stages": 2, "maxnreg": 128}
        res = client.evaluate("output_fused", "fused_q", point, warm=True)
    finally:
        client.close()
    assert res["status"] == "ok", res


def test_concurrent_saves_to_one_kernel_file_keep_every_entry(tmp_path):
    """Two sweeps at once (one per GPU) write the same kernel files: no entry may be lost."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_save_many, args=(str(tmp_path), w)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs)
    entries = tuned.load_entries(tuned.cache_path(tmp_path, "Fake GPU", "state"))
    assert len(entries) == 4 * 15


def _save_many(cache_dir, writer):
    from pathlib import Path

    from gdnbench.kernels import tuned

    for i in range(15):
        key = {"gpu": "Fake GPU", "compute_capability": "9.0", "triton": "3.6.0", "source_hash": "sha256:x",
               "shape_key": f"w{writer}_s{i}", "variant": "plain"}
        tuned.save_entry(Path(cache_dir), {"key": key, "kernel": "state", "best": None})


def _claims_in_turn(sizes, world, order):
    """Ranks claiming in the given turn order (a rank index per claim) on one shared counter."""
    fetch_add = at_dist.local_counters()
    gens = [at.claim_searches(sizes, at_dist.Dist(r, world, fetch_add=fetch_add), "t") for r in range(world)]
    got = {r: [] for r in range(world)}
    for r in order:
        nxt = next(gens[r], None)
        if nxt is not None:
            got[r].append(nxt)
    for r in range(world):
        got[r] += list(gens[r])
    return got


def test_claimed_searches_run_exactly_once_and_ranks_start_on_different_shapes():
    got = _claims_in_turn([3, 2, 4], 2, [0, 1] * 10)
    assert got[0][0] == (0, 0) and got[1][0] == (1, 0)
    every = sorted(u for r in got for u in got[r])
    assert every == [(k, i) for k, n in enumerate([3, 2, 4]) for i in range(n)]


def test_a_rank_that_finishes_its_shape_takes_from_the_fullest_one():
    # rank 1 claims five times in a row while rank 0 holds one search of shape 0
    got = _claims_in_turn([2, 2, 3], 2, [0, 1, 1, 1, 1, 1])
    assert got[1][:2] == [(1, 0), (1, 1)]  # its own shape first
    assert got[1][2] == (2, 0)  # then the shape with the most left (3 > 1)
    assert sorted(got[0] + got[1]) == [(k, i) for k, n in enumerate([2, 2, 3]) for i in range(n)]


def test_claims_of_a_single_rank_and_of_nothing():
    assert list(at.claim_searches([2, 1], at_dist.Dist(), "x")) == [(0, 0), (0, 1), (1, 0)]
    assert list(at.claim_searches([], at_dist.Dist(), "x")) == []


def _thread_ranks(world, fn):
    """Run fn(dist) on ``world`` threads whose Dist.all_gather meets at a barrier: [return values]."""
    import threading

    slots, barrier, out = [None] * world, threading.Barrier(world, timeout=60), [None] * world
    fetch_add = at_dist.local_counters()

    def gather(rank):
        def all_gather(obj):
            slots[rank] = obj
            barrier.wait()
            got = list(slots)
            barrier.wait()
            return got
        return all_gather

    def run(rank):
        out[rank] = fn(at_dist.Dist(rank, world, rank, gather(rank), fetch_add))

    threads = [threading.Thread(target=run, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return out


def test_two_ranks_share_out_searches_and_rank_0_gets_every_entry(tmp_path):
    pairs = _smoke_pairs("gdn_fixed_b2", "gdn_packed_gva3")
    tasks = at_plan.plan_tasks(["flag"], ["gram", "state", "output"])
    started = {0: [], 1: []}
    searched = {0: [], 1: []}

    def rank_main(dist):
        opts = at_plan.TuneOptions(device="cpu", budget_s=0, cache_dir=tmp_path, shard="searches")
        on_event = lambda kind, info: kind == "entry" and searched[dist.rank].append(  # noqa: E731
            (info["shape"].id, info["task"].kernel))
        return at.tune(pairs, tasks, opts, dist, on_event=on_event, env=ENV if dist.rank == 0 else None,
                       client_factory=lambda spec: _FakeWorker(spec, started=started[dist.rank]))

    out = _thread_ranks(2, rank_main)
    # six searches, each run once; rank 0 starts on shape 1, rank 1 on shape 2
    both = sorted(searched[0] + searched[1])
    assert both == sorted((s, k) for s in ("gdn_fixed_b2", "gdn_packed_gva3") for k in ("gram", "state", "output"))
    assert searched[0][0][0] == "gdn_fixed_b2" and searched[1][0][0] == "gdn_packed_gva3"
    assert started[0][0] == "gdn_fixed_b2" and started[1][0] == "gdn_packed_gva3"
    assert len(out[0]) == 6 and len(out[1]) == len(searched[1])
    saved = sum(len(tuned.load_entries(p)) for p in tmp_path.glob("*/*.json"))
    assert saved == 6


def test_two_ranks_in_candidate_mode_run_every_search_in_lockstep(tmp_path):
    pairs = _smoke_pairs("gdn_fixed_b2")
    tasks = at_plan.plan_tasks(["flag"], ["state", "output"])
    seen = {0: 0, 1: 0}

    class Counting(_FakeWorker):
        def evaluate(self, kernel, route, point):
            seen[self.rank] += 1
            return super().evaluate(kernel, route, point)

    def rank_main(dist):
        opts = at_plan.TuneOptions(device="cpu", budget_s=1e9, cache_dir=tmp_path, shard="candidates")

        def factory(spec):
            w = Counting(spec)
            w.rank = dist.rank
            return w
        return at.tune(pairs, tasks, opts, dist, env=ENV if dist.rank == 0 else None, client_factory=factory)

    out = _thread_ranks(2, rank_main)
    assert len(out[0]) == len(out[1]) == 2  # both ranks ran both searches
    # every candidate evaluated once, on one of the two ranks, about half each
    assert sum(e["search"]["evaluated"] for e in out[0]) == seen[0] + seen[1]
    assert seen[0] > 0 and seen[1] > 0 and abs(seen[0] - seen[1]) <= 10


def test_ranks_on_node_follow_torchrun_local_world(monkeypatch):
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert at_dist.ranks_on_node(at_dist.Dist(0, 16)) == 16
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # two nodes of eight GPUs
    assert at_dist.ranks_on_node(at_dist.Dist(0, 16)) == 8


def test_fused_out_is_timed_under_every_gate_regime():
    """fused_out in segments is fast where gates forget and serial where they do not: a candidate's time is the
    geometric mean of its times under each gate regime's inputs."""
    client = _smoke_client("gdn_fixed_b2")
    try:
        point = {"BK": 32, "BV": 32, "segments": 2, "num_warps": 4, "num_stages": 1, "maxnreg": None}
        res = client.evaluate("fused_out", "flag", point)
    finally:
        client.close()
    assert res["status"] == "ok", res
    t = res["time_us_by_gates"]
    assert sorted(t) == ["long", "strong"] and all(v > 0 for v in t.values())
    assert res["time_us"] == pytest.approx((t["long"] * t["strong"]) ** 0.5)
