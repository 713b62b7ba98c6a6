"""Gate: conversation split, ONNX export parity, load-time checks, and that it pays off."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_hvd.cli.main import main as hvd
from sglang_hvd.features import FEATURE_NAMES
from sglang_hvd.gate import Gate, GateError
from sglang_hvd.trace import TokenizerId, TraceRecord, token_array

torch = pytest.importorskip("torch", reason="the gate tests need the train extra (tests/run installs it)")

from sglang_hvd.predictor.export import ExportParityError, to_onnx, write_gate_dir  # noqa: E402
from sglang_hvd.predictor.mlp import TrainConfig, train_mlp  # noqa: E402
from sglang_hvd.predictor.split import TEST, TRAIN, VALIDATION, split_conversations  # noqa: E402


def rec(conv, turn, source):
    return TraceRecord(req_id=f"{conv}#{turn}", conv_id=conv, turn=turn, source=source, tokenizer=TokenizerId("t", "d"),
                       prompt_ids=token_array([1]), output_ids=token_array([2]))


@settings(max_examples=50, deadline=None)
@given(convs=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 4), st.sampled_from(["a", "b", "c"])),
                     min_size=1, max_size=60),
       val=st.sampled_from([0.1, 0.2, 0.3]), test=st.sampled_from([0.0, 0.2]), seed=st.integers(0, 3))
def test_split_never_puts_a_conversation_on_two_sides(convs, val, test, seed):
    records = [rec(f"{src}{c}", t, src) for c, turns, src in convs for t in range(turns)]
    side = split_conversations(records, val, test, seed)
    assert set(side) == {r.conv_id for r in records}  # one side per conversation, by construction of a dict
    by_source = {}
    for r in records:
        by_source.setdefault(r.source, set()).add(r.conv_id)
    for convs_of_source in by_source.values():
        if len(convs_of_source) >= 3:  # every side is represented in every source large enough
            assert {side[c] for c in convs_of_source} >= {TRAIN, VALIDATION} | ({TEST} if test else set())
    assert side == split_conversations(list(reversed(records)), val, test, seed)  # order-independent


def _tiny_model():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, len(FEATURE_NAMES))).astype(np.float32)
    y = (np.abs(x[:, 0]) * 3).astype(np.float32)
    return train_mlp(x[:300], y[:300], x[300:], y[300:], TrainConfig(hidden=(16, 16), max_epochs=3)).model, x


def _spec():
    from sglang_hvd.decision import DecisionRule
    from sglang_hvd.drafter import DrafterConfig
    from sglang_hvd.gate_spec import GateSpec
    from sglang_hvd.verify import VerifyModel

    return GateSpec(decision=DecisionRule(1.0, 3), drafter=DrafterConfig(), verify=VerifyModel(),
                    tokenizer=TokenizerId("t", "d"))


def test_export_matches_torch_and_loads_as_a_gate(tmp_path):
    model, x = _tiny_model()
    flags = np.zeros(10, dtype=np.uint16)
    diff = write_gate_dir(str(tmp_path / "g"), model, _spec(), flags, x[:100])
    assert diff <= 1e-4
    assert sorted(os.listdir(tmp_path / "g")) == ["gate.json", "gate.onnx", "token_flags.npy"]
    umask = os.umask(0)
    os.umask(umask)
    # not mkdtemp's 0700: servers of other users read it
    assert os.stat(tmp_path / "g").st_mode & 0o777 == 0o777 & ~umask
    gate = Gate(str(tmp_path / "g"))
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    got = gate.predict(x)  # any batch size: the batch axis is dynamic
    assert got.shape == (400,) and np.max(np.abs(got - want)) <= 1e-4
    assert (gate.rule.threshold, gate.rule.eagle_reserve, gate.verify_model.shape.nodes) == (1.0, 3, 16)
    proto = to_onnx(model)
    assert [i.name for i in proto.graph.input] == ["features"]
    assert [o.name for o in proto.graph.output] == ["accept_len"]
    assert json.loads((tmp_path / "g" / "gate.json").read_text())["export"]["parity_rows"] == 100


def test_a_failed_parity_check_writes_nothing(tmp_path, monkeypatch):
    model, x = _tiny_model()
    import sglang_hvd.predictor.export as export

    monkeypatch.setattr(export, "parity", lambda proto, m, rows: 0.5)
    with pytest.raises(ExportParityError, match=r"differs from torch by 0.5 \(> 0.0001\)"):
        write_gate_dir(str(tmp_path / "g"), model, _spec(), np.zeros(10, dtype=np.uint16), x[:10])
    assert not (tmp_path / "g").exists() and os.listdir(tmp_path) == []


def _curve_model(width=4):
    from sglang_hvd.predictor.mlp import CurveLabels

    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, len(FEATURE_NAMES))).astype(np.float32)
    chain = np.minimum(np.abs(x[:, 0]) * 3, 6).astype(np.int64)  # the chain's accepted length
    lens = np.full(400, 6)
    fit = train_mlp(x[:300], chain[:300].astype(np.float32), x[300:], chain[300:].astype(np.float32),
                    TrainConfig(hidden=(16, 16), max_epochs=3), width, CurveLabels(chain[:300], lens[:300]),
                    CurveLabels(chain[300:], lens[300:]))
    return fit, x


def test_a_gate_with_a_payoff_curve_exports_both_outputs_with_parity_and_serves_them(tmp_path):
    import dataclasses

    fit, x = _curve_model(width=4)
    model = fit.model
    assert model.curve_width == 4 and len(fit.validation_loss) == fit.epochs
    # the survival terms are part of the loss early stopping watches: above the MSE alone
    assert all(loss > mse for loss, mse in zip(fit.validation_loss, fit.validation_mse))
    spec = dataclasses.replace(_spec(), payoff_curve=4)
    diff = write_gate_dir(str(tmp_path / "g"), model, spec, np.zeros(10, dtype=np.uint16), x[:100])
    assert diff <= 1e-4
    assert json.loads((tmp_path / "g" / "gate.json").read_text())["payoff_curve"] == 4
    gate = Gate(str(tmp_path / "g"))
    pred, survival = gate.predict_curve(x)
    with torch.no_grad():
        xt = torch.from_numpy(x)
        want_pred, want_survival = model(xt).numpy(), model.survival(xt).numpy()
    assert gate.curve_width == 4 and pred.shape == (400,) and survival.shape == (400, 4)
    assert np.max(np.abs(pred - want_pred)) <= 1e-4 and np.max(np.abs(survival - want_survival)) <= 1e-4
    assert np.array_equal(gate.predict(x), pred)  # the one value, as a gate without a curve gives it
    # a gate.json that promises a curve the graph lacks, or the reverse, or a bad width: refused at load
    plain_model, _ = _tiny_model()
    write_gate_dir(str(tmp_path / "plain"), plain_model, spec, np.zeros(10, dtype=np.uint16), x[:10])
    with pytest.raises(GateError, match=r"outputs \['accept_len', 'accept_survival'\] \(gate.json payoff_curve 4\), "
                                        r"got \['accept_len'\]"):
        Gate(str(tmp_path / "plain"))
    for bad, message in ((0, r"outputs \['accept_len'\] \(gate.json payoff_curve 0\), got \['accept_len', "
                             r"'accept_survival'\]"),
                         (-1, r"bad 'payoff_curve' \(a number of widths >= 0 expected, got -1\)")):
        data = json.loads((tmp_path / "g" / "gate.json").read_text())
        data["payoff_curve"] = bad
        (tmp_path / "g" / "gate.json").write_text(json.dumps(data))
        with pytest.raises(GateError, match=message):
            Gate(str(tmp_path / "g"))
    # the harness's faulty gate breaks the accept_len output of a curve gate too: it loads, then fails but at batch 2
    from sglang_hvd.harness.faults import faulty_gate

    data = json.loads((tmp_path / "g" / "gate.json").read_text())
    data["payoff_curve"] = 4
    (tmp_path / "g" / "gate.json").write_text(json.dumps(data))
    broken = Gate(faulty_gate(str(tmp_path / "g"), str(tmp_path / "broken"), works_only_at=2))
    assert broken.predict_curve(x[:2])[1].shape == (2, 4)
    with pytest.raises(Exception, match="Reshape"):
        broken.predict_curve(x[:3])
    # a gate written before payoff curves reads as one without (the geometric model)
    data = json.loads((tmp_path / "plain" / "gate.json").read_text())
    del data["payoff_curve"]
    (tmp_path / "plain" / "gate.json").write_text(json.dumps(data))
    assert Gate(str(tmp_path / "plain")).predict_curve(x[:3])[1] is None


def test_bad_gates_are_refused_at_load_time_with_the_reason(tmp_path):
    model, x = _tiny_model()
    good = tmp_path / "good"
    write_gate_dir(str(good), model, _spec(), np.zeros(10, dtype=np.uint16), x[:10])

    def variant(name, edit):
        d = tmp_path / name
        shutil.copytree(good, d)
        edit(d)
        return str(d)

    with pytest.raises(GateError, match="gate directory not found"):
        Gate(str(tmp_path / "nowhere"))
    schema0 = {**_spec().to_json(), "feature_schema_version": 0}
    old = variant("old", lambda d: (d / "gate.json").write_text(json.dumps(schema0)))
    with pytest.raises(GateError, match=r"trained on feature schema 0 \(67 features\), "
                                        r"but this sglang-hvd computes schema 2 \(67 features\)"):
        Gate(old)
    with pytest.raises(GateError, match="token_flags.npy: missing"):
        Gate(variant("noflags", lambda d: os.unlink(d / "token_flags.npy")))
    with pytest.raises(GateError, match="onnxruntime cannot load gate.onnx"):
        Gate(variant("corrupt", lambda d: (d / "gate.onnx").write_bytes(b"not a model")))
    with pytest.raises(GateError, match="not valid JSON"):
        Gate(variant("badjson", lambda d: (d / "gate.json").write_text("{")))
    v1 = {**_spec().to_json(), "format_version": 1}
    with pytest.raises(GateError, match=r"gate format version 1, this sglang-hvd reads 2 "
                                        r"\(written before verify shapes; retrain it with `hvd train`\)"):
        Gate(variant("v1", lambda d: (d / "gate.json").write_text(json.dumps(v1))))
    bad_shape = _spec().to_json()
    bad_shape["verify"]["shape"]["nodes"] = 40
    with pytest.raises(GateError, match=r"bad 'verify' \(nodes - 1 = 39 exceeds what EAGLE3 drafts"):
        Gate(variant("badshape", lambda d: (d / "gate.json").write_text(json.dumps(bad_shape))))
    no_decision = {k: v for k, v in _spec().to_json().items() if k != "decision"}
    with pytest.raises(GateError, match="missing 'decision'"):
        Gate(variant("nodecision", lambda d: (d / "gate.json").write_text(json.dumps(no_decision))))


def test_demo_gate_beats_cache_only_and_eagle3_on_held_out_sessions(demo_dir):
    """The real claim, on synthetic sessions the gate never saw (a quarter held out)."""
    with open(os.path.join(demo_dir, "eval.json")) as f:
        result = json.load(f)
    with open(os.path.join(demo_dir, "demo.json")) as f:  # hvd demo --json: the same evaluation
        assert json.load(f) == result
    cycles = {name: p["cycles_per_1k"] for name, p in result["overall"]["policies"].items()}
    assert cycles["hvd"] < 0.95 * cycles["cache_only"]
    assert cycles["hvd"] < 0.5 * cycles["eagle3_only"]
    # two-branch rows and row trees can beat the choose-one oracle; the gate stays near the tree oracle
    assert cycles["tree_oracle"] <= cycles["oracle"] and cycles["hvd"] < 1.05 * cycles["tree_oracle"]
    tools = result["sources"]["synth-tools"]["policies"]
    assert tools["hvd"]["cycles_per_1k"] < tools["cache_only"]["cycles_per_1k"]
    spec = json.loads(open(os.path.join(demo_dir, "gate", "gate.json")).read())
    held_out = set(spec["split"]["test_conversations"])
    assert held_out and held_out.isdisjoint(spec["split"]["validation_conversations"])
    assert spec["training"]["rows"] > 0 and spec["export"]["parity_max_abs_diff"] <= 1e-4


def test_eval_and_train_refuse_bad_inputs(demo_dir, tmp_path, capsys):
    traces = os.path.join(demo_dir, "traces.jsonl")
    assert hvd(["eval", traces, "--gate", str(tmp_path / "nope")]) == 2
    assert "gate directory not found" in capsys.readouterr().err
    other = tmp_path / "tok"
    from sglang_hvd.synth.workload import SynthConfig, write_workload

    write_workload(SynthConfig(sessions=4, seed=99, vocab_size=400), str(other))
    assert hvd(["train", traces, "--tokenizer", str(other / "tokenizer"), "-o", str(tmp_path / "g")]) == 2
    err = capsys.readouterr().err
    assert "the traces were tokenized with hvd-synth-bpe@" in err and "pass the tokenizer used by `hvd import`" in err
    assert not (tmp_path / "g").exists()
    tok = os.path.join(demo_dir, "tokenizer")
    # dense positions are labelled with the chain's payoff: siblings are refused with them, and off by default
    assert hvd(["train", traces, "--tokenizer", tok, "-o", str(tmp_path / "d"), "--positions", "dense",
                "--cache-siblings", "2"]) == 2
    assert "with --positions dense pass --cache-siblings 0" in capsys.readouterr().err
    assert hvd(["train", traces, "--tokenizer", tok, "-o", str(tmp_path / "g1"), "--cache-siblings", "2",
                "--verify-topk", "1", "--verify-steps", "3", "--verify-nodes", "4"]) == 2
    assert "cache siblings need tree rows (topk > 1); the shape is topk 1, steps 3, 4 nodes" in capsys.readouterr().err
    gate = os.path.join(demo_dir, "gate")
    assert hvd(["eval", traces, "--gate", gate, "--cache-siblings", "2", "--verify-topk", "1", "--verify-steps", "3",
                "--verify-nodes", "4"]) == 2
    assert "--cache-siblings 2: rows at topk 1 are chains" in capsys.readouterr().err


def test_eval_plot_and_json(demo_dir, tmp_path):
    pytest.importorskip("matplotlib", reason="--plot needs matplotlib")
    out, png = tmp_path / "e.json", tmp_path / "p.png"
    assert hvd(["eval", os.path.join(demo_dir, "traces.jsonl"), "--gate", os.path.join(demo_dir, "gate"), "--held-out",
                "--json", str(out), "--plot", str(png), "--plot-thresholds", "0,1,4"]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(out.read_text())
    assert [e["threshold"] for e in data["sweep"]["gate"]] == [0.0, 1.0, 4.0]
    assert set(data["overall"]["gate"]) >= {"precision_at_6", "recall_at_6", "mae", "cache_pick_rate"}


def test_eval_bounds_the_drafter_as_a_server_can(demo_dir, tmp_path, capsys):
    """--max-occurrences / --max-scan / --global-max-tokens replace the gate's resource bounds in every drafter of the
    run, as a server's --hvd-max-occurrences and the like do."""
    from sglang_hvd.cli.options import BOUND_FLAGS
    from sglang_hvd.drafter.protocol import RESOURCE_BOUNDS

    assert tuple(BOUND_FLAGS) == RESOURCE_BOUNDS  # a flag for each bound a server may set
    traces, gate = os.path.join(demo_dir, "traces.jsonl"), os.path.join(demo_dir, "gate")
    figures = {}
    for name, flags in (("gate's", []), ("one occurrence", ["--max-occurrences", "1", "--max-scan", "1"])):
        out = tmp_path / "e.json"
        assert hvd(["eval", traces, "--gate", gate, "--held-out", "--policies", "cache_only,hvd", *flags,
                    "--json", str(out)]) == 0
        figures[name] = json.loads(out.read_text())
    text = capsys.readouterr().out
    assert "drafter bounds set by flags: max_occurrences 1 (the gate's 1,024), max_scan 1 (the gate's 4,096)" in text
    assert figures["gate's"]["drafter_bounds"] == {"global_max_tokens": 2_000_000, "max_occurrences": 1024,
                                                   "max_scan": 4096}
    assert figures["one occurrence"]["drafter_bounds"] == {"global_max_tokens": 2_000_000, "max_occurrences": 1,
                                                           "max_scan": 1}
    cache_only = [f["overall"]["policies"]["cache_only"]["cycles_per_1k"] for f in figures.values()]
    assert cache_only[0] != cache_only[1]  # a draft walked from one occurrence is another draft
    with pytest.raises(SystemExit) as e:  # argparse
        hvd(["eval", traces, "--gate", gate, "--max-scan", "nan"])
    assert e.value.code == 2 and "--max-scan: expected an integer in [1, " in capsys.readouterr().err


def test_gate_spec_round_trips_through_json():
    from sglang_hvd.gate_spec import GateSpec, GateSplit

    spec = dataclasses_replace(_spec(), rule_threshold=1.5,
                               split=GateSplit(seed=3, group_by="task", test_conversations=("a",)),
                               provenance={"model": {"hidden": [64, 64]}})
    back = GateSpec.from_json(json.loads(json.dumps(spec.to_json())))
    assert back == dataclasses_replace(spec, provenance={"model": {"hidden": [64, 64]}})
    assert back.verify.shape.describe() == "topk 4, steps 3, 16 nodes" and back.verify.eagle3_tokens == 2.1


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def test_decision_rules_carry_cache_siblings_and_older_gates_read_as_chains():
    from sglang_hvd.decision import DecisionRule
    from sglang_hvd.gate_spec import GateSpec

    spec = dataclasses_replace(_spec(), decision=DecisionRule(0.5, 1, 4))
    d = spec.to_json()
    assert d["decision"] == {"threshold": 0.5, "eagle_reserve": 1, "cache_siblings": 4}
    assert GateSpec.from_json(json.loads(json.dumps(d))).decision == DecisionRule(0.5, 1, 4)
    del d["decision"]["cache_siblings"]  # a gate written before row trees
    assert GateSpec.from_json(d).decision == DecisionRule(0.5, 1, 0)


def test_training_labels_are_the_payoff_of_the_row_the_decision_verifies():
    from sglang_hvd.drafter import DrafterConfig
    from sglang_hvd.predictor.dataset import build_dataset
    from sglang_hvd.verify import VerifyModel, VerifyShape

    # "1 2" continued by 3 8 twice and by 4 7 once; the output takes 4 7 5: the chain (3 8)
    # accepts nothing, the row tree with siblings (3 8, then 4 7 under the root) accepts 2.
    r = TraceRecord(req_id="a", conv_id="a", turn=0, source="s", tokenizer=TokenizerId("t", "d"),
                    prompt_ids=token_array([1, 2, 3, 8, 1, 2, 3, 8, 1, 2, 4, 7, 9, 1, 2]),
                    output_ids=token_array([4, 7, 5]))
    model, flags = VerifyModel(VerifyShape(4, 3, 16)), np.zeros(20, np.uint16)
    cfg = DrafterConfig(max_spec_factor=1.0, max_spec_offset=0.0)
    chain = build_dataset([r], "python", cfg, flags, positions="serving", model=model)
    tree = build_dataset([r], "python", cfg, flags, positions="serving", model=model, siblings=4)
    # the first rows: the four behaviour policies' views of position 0
    assert chain.accept_len[:4].tolist() == [0, 0, 0, 0] and tree.accept_len[:4].tolist() == [2, 2, 2, 2]
    # the payoff curve learns the chain's own accepted length, whatever the row adds
    assert chain.chain_accept[:4].tolist() == [0, 0, 0, 0] and tree.chain_accept[:4].tolist() == [0, 0, 0, 0]
    assert np.all(tree.chain_accept <= tree.accept_len) and np.array_equal(chain.chain_accept, chain.accept_len)
    with pytest.raises(ValueError, match="with --positions dense pass --cache-siblings 0"):
        build_dataset([r], "python", cfg, flags, positions="dense", model=model, siblings=4)


def test_task_split_keeps_every_trial_of_a_task_on_one_side():
    from sglang_hvd.predictor.split import task_of

    assert task_of("tau-bench/airline/gpt-4o/task007/trial2") == "task007"
    assert task_of("swe-agent/trajectories/demonstrations/replay__marshmallow-code__marshmallow-1867__xml/"
                   "marshmallow-code__marshmallow-1867") == "marshmallow-code__marshmallow-1867"
    records = [rec(f"tau/task{t:03d}/trial{k}", 0, "tau") for t in range(12) for k in range(4)]
    side = split_conversations(records, 0.25, 0.25, seed=1, group_by="task")
    for t in range(12):
        assert len({side[f"tau/task{t:03d}/trial{k}"] for k in range(4)}) == 1
    assert set(side.values()) == {TRAIN, VALIDATION, TEST}
    by_conv = split_conversations(records, 0.25, 0.25, seed=1)
    assert any(len({by_conv[f"tau/task{t:03d}/trial{k}"] for k in range(4)}) > 1 for t in range(12))


def test_replay_runs_the_hvd_policy_with_a_gate_and_refuses_other_tokenizers(demo_dir, synth_traces, tmp_path, capsys):
    traces, gate = os.path.join(demo_dir, "traces.jsonl"), os.path.join(demo_dir, "gate")
    out = tmp_path / "r.json"
    assert hvd(["replay", traces, "--gate", gate, "--policies", "eagle3_only,hvd,oracle", "--limit", "40",
                "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["verify"] == {"shape": {"topk": 4, "steps": 3, "nodes": 16},
                              "eagle3_curve": "1:1.45,2:1.66,3:1.75,7:1.95,15:2.1"}
    p = data["overall"]["policies"]
    assert p["hvd"]["cycles_per_1k"] < p["eagle3_only"]["cycles_per_1k"] and p["hvd"]["two_branch_rate"] > 0
    assert hvd(["replay", traces, "--policies", "hvd"]) == 2
    assert "the hvd policy needs a gate: pass --gate GATE_DIR" in capsys.readouterr().err
    assert hvd(["replay", traces, "--gate", gate, "--policies", "hvd", "--max-spec-factor", "3"]) == 2
    assert "--max-spec-factor 3.0: the gate was trained with max_spec_factor 1.0; drop --max-spec-factor" in \
        capsys.readouterr().err
    assert hvd(["replay", synth_traces, "--gate", gate, "--policies", "hvd"]) == 2  # another synth tokenizer (seed 7)
    assert "but the gate" in capsys.readouterr().err


def test_a_gates_digest_names_its_content_not_its_path(tmp_path):
    model, x = _tiny_model()
    a, b = tmp_path / "a", tmp_path / "replica" / "b"
    write_gate_dir(str(a), model, _spec(), np.zeros(10, dtype=np.uint16), x[:10])
    shutil.copytree(a, b)
    digest = Gate(str(a)).digest
    assert len(digest) == 16 and int(digest, 16) >= 0
    assert Gate(str(b)).digest == digest  # another replica, the same gate
    assert Gate(str(b), threshold=9.0).digest == digest  # a served override is reported beside it, not in it
    spec = _spec().to_json()
    spec["decision"]["threshold"] = spec["decision"]["threshold"] + 0.5
    (b / "gate.json").write_text(json.dumps(spec))
    assert Gate(str(b)).digest != digest  # a retrained / recalibrated gate
    np.save(b / "token_flags.npy", np.ones(10, dtype=np.uint16))
    assert Gate(str(b)).digest != digest


def test_train_learns_a_payoff_curve_unless_told_geometric():
    from sglang_hvd.predictor.mlp import TrainConfig
    from sglang_hvd.predictor.pipeline import TrainOptions
    from sglang_hvd.predictor.train_cli import _options, build_parser

    def options(*flags):
        return _options(build_parser().parse_args(["t.jsonl", "--tokenizer", "qwen3", "-o", "g", *flags]),
                        TrainConfig, TrainOptions)

    assert options().payoff_curve is True and options("--payoff", "curve").payoff_curve is True
    assert options("--payoff", "geometric").payoff_curve is False
