"""The re-keying tool's decisions, with fake digest functions (no compile here)."""

import pytest

from gdnbench.autotune import rekey

OLD, NEW = "sha256:old", "sha256:new"


def entry(source_hash=OLD, triton="3.6.0"):
    return {"kernel": "state", "route": "flag", "best": {"config": {"BV": 32}},
            "key": {"source_hash": source_hash, "triton": triton, "variant": "plain",
                    "shape_key": "kda_K128_V128_H96_HV96_bfloat16_fixed_T8192"}}


def fixed(result):
    return lambda e: result


def never(e):
    raise AssertionError("compiled an entry that needs no compile")


def test_identical_code_moves_the_entry_to_the_new_hash():
    e = entry()
    [o] = rekey.rekey_entries([e], OLD, NEW, "3.6.0", fixed(["state_kernel:ab"]), fixed(["state_kernel:ab"]))
    assert o.action == "rekeyed"
    assert e["key"]["source_hash"] == NEW
    assert e["rekeyed"]["from"] == OLD and "state_kernel:ab" in e["rekeyed"]["why"]
    assert "before" not in e["rekeyed"]


def test_a_second_move_keeps_the_first_record():
    e = entry()
    e["rekeyed"] = {"from": "sha256:older", "why": "config kept across an edit, re-timed"}
    rekey.rekey_entries([e], OLD, NEW, "3.6.0", fixed(["state_kernel:ab"]), fixed(["state_kernel:ab"]))
    assert e["rekeyed"]["from"] == OLD
    assert e["rekeyed"]["before"] == {"from": "sha256:older", "why": "config kept across an edit, re-timed"}


def test_changed_code_leaves_the_entry_stale():
    e = entry()
    [o] = rekey.rekey_entries([e], OLD, NEW, "3.6.0", fixed(["state_kernel:ab"]), fixed(["state_kernel:cd"]))
    assert (o.action, o.reason) == ("stale", "code changed: state_kernel:cd")
    assert e["key"]["source_hash"] == OLD and "rekeyed" not in e


def test_a_failed_compile_or_no_launch_leaves_the_entry_stale():
    e = entry()
    assert rekey.decide(e, OLD, NEW, "3.6.0", fixed("boom"), never).reason == "compile failed: boom"
    assert rekey.decide(e, OLD, NEW, "3.6.0", fixed([]), fixed([])).action == "stale"
    assert e["key"]["source_hash"] == OLD


@pytest.mark.parametrize("e, why", [(entry(source_hash="sha256:older"), "stale before"),
                                    (entry(source_hash=NEW), "current"),
                                    (entry(triton="3.5.1"), "Triton 3.5.1")])
def test_entries_not_on_the_old_hash_or_triton_are_skipped_without_compiling(e, why):
    o = rekey.decide(e, OLD, NEW, "3.6.0", never, never)
    assert o.action == "skipped" and why in o.reason


def test_normalized_code_drops_line_info_but_keeps_instructions():
    ptx = "\t.loc\t1 {} 5\n\tadd.s32 \t%r1, %r2, %r3;\n$L__tmp{}:\n\t.section\t.debug_info\n{{ {} }}"
    sass = ("\tFunction : k\n        /*0000*/                   IMAD R1, R2, R3 ;  /* 0x0 */\n"
            "        /*10930*/                  RET.REL.NODEC R2 0x0 ;  /* 0x0 */\n")
    a = rekey.normalized_code(ptx.format(10, 1, "x"), sass)
    assert a == rekey.normalized_code(ptx.format(12, 4, "y"), sass)
    assert a != rekey.normalized_code(ptx.format(10, 1, "x").replace("add", "sub"), sass)
    assert a != rekey.normalized_code(ptx.format(10, 1, "x"), sass.replace("R3", "R4"))
    assert a != rekey.normalized_code(ptx.format(10, 1, "x"), sass.replace("R2 0x0", "R4 0x0"))  # past 0xffff


def test_an_old_tree_without_gdnbench_is_refused(tmp_path, capsys):
    assert rekey.main(["--old", str(tmp_path)]) == 2
    assert "--old" in capsys.readouterr().err


def test_the_compile_child_imports_a_relative_old_tree_by_its_absolute_path(tmp_path, monkeypatch):
    """The child runs in the tree with the script's folder first on sys.path, so a relative PYTHONPATH
    would miss the tree and import the installed gdnbench: every entry would compare with itself."""
    seen = {}

    def run(cmd, **kw):
        seen.update(kw)
        return type("Done", (), {"returncode": 0, "stdout": "[[]]", "stderr": ""})()

    (tmp_path / "old").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(rekey.subprocess, "run", run)
    e = entry()
    assert rekey.tree_digests(rekey.Path("old"), [e])(e) == []
    assert seen["env"]["PYTHONPATH"] == str((tmp_path / "old").resolve())


def test_every_path_that_launches_a_kernel_is_compiled():
    """aqk runs in the one-pass path and in the in-loop one (under fused_qk with k's rstd on Aqk's columns, and with
    the k tile where the loop reads it): each is compiled, so an edit to any of them leaves the entry stale."""
    from gdnbench.kernels import ops, tuned

    cfg = ops.default_config(128, 128, 2)
    forms = lambda kernel, route: [(c.one_pass, c.in_loop, c.fused_out.k_rstd_tile)
                                   for c in rekey.run_paths(kernel, "gdn", route, cfg, tuned)]
    assert forms("aqk", "fused_qk") == [(True, None, False), (True, "wu", False), (True, "wu", True)]
    assert forms("aqk", "fused_q") == [(True, None, False), (True, "wu", False)]
    assert forms("fused_out", "fused_qk") == [(True, "wu", False)]
    assert forms("gram", "fused_qk") == [(False, None, False)]
    kda = ops.default_config(128, 128, 2, "kda")
    assert rekey.run_paths("kda_state_out", "kda", "flag", kda, tuned)[0].one_pass is True
    assert rekey.run_paths("kda16_prep", "kda", "flag", kda, tuned)[0].kda_chunk16 is True
