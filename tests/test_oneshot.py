"""One-shot protocols (within/across alphabets, CI), split modes (swap, final fit), class transforms,
test-time shifted views in the exported graph, the handwriting augmentation, the Omniglot metadata."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from PIL import Image

from metricsearch.app.cli import main
from metricsearch.data import ImageSet, concat_sets, load_split, resplit, with_transformed_classes
from metricsearch.evaluation import evaluate, format_metrics, one_shot_accuracy, one_shot_error
from metricsearch.evaluation.oneshot import (
    across_alphabet_episodes, episode_errors, mean_ci, within_alphabet_episodes,
)


def alphabet_set(class_counts=(25, 22, 17), drawers: int = 6, seed: int = 0):
    """Labels, groups, sources of a synthetic Omniglot: alphabets of `class_counts` characters, each
    character drawn once by each drawer (one drawer's drawing of one character is missing)."""
    labels, groups, sources = [], [], []
    label = 0
    for a, n in enumerate(class_counts):
        for _ in range(n):
            for d in range(drawers):
                if (label, d) == (3, 2):
                    continue
                labels.append(label)
                groups.append(f"alphabet{a}")
                sources.append(f"{d + 1:02d}")
            label += 1
    return np.array(labels), np.array(groups, dtype=object), np.array(sources, dtype=object)


def test_within_alphabet_episodes_keep_the_official_protocol() -> None:
    labels, groups, sources = alphabet_set()
    seen_groups = set()
    for support, query in within_alphabet_episodes(labels, groups, sources, ways=20, episodes=300, seed=1):
        assert len(support) == len(query) == 20
        assert len(set(groups[support]) | set(groups[query])) == 1  # one alphabet per episode
        seen_groups |= set(groups[support])
        assert len(set(labels[support])) == 20 and list(labels[support]) == list(labels[query])
        assert all(sources[support] != sources[query])  # support and query by different drawers
        if 3 not in labels[support]:  # complete characters: one support drawer, one query drawer
            assert len(set(sources[support])) == 1 and len(set(sources[query])) == 1
    assert seen_groups == {"alphabet0", "alphabet1"}  # alphabet2 has 17 characters: no 20-way episode


def test_within_alphabet_needs_a_large_enough_group() -> None:
    labels, groups, sources = alphabet_set((10, 12))
    with pytest.raises(ValueError, match="20 classes"):
        next(within_alphabet_episodes(labels, groups, sources, 20, 1, 0))
    with pytest.raises(ValueError, match="group"):
        one_shot_error(np.eye(len(labels)), labels, None, None, ways=5)


def test_across_alphabet_episodes_mix_alphabets_and_match_the_legacy_accuracy() -> None:
    labels, groups, sources = alphabet_set()
    mixed = [len(set(groups[s])) > 1 for s, _ in across_alphabet_episodes(labels, 20, 50, 0)]
    assert np.mean(mixed) > 0.9
    x = np.random.default_rng(0).normal(size=(len(labels), 8))
    error, _, _ = one_shot_error(x, labels, groups, sources, ways=20, protocol="across_alphabets", episodes=200)
    assert one_shot_accuracy(x, labels, ways=20, episodes=200) == pytest.approx(1 - error)


def test_one_shot_error_is_zero_for_perfect_and_chance_for_noise_embeddings() -> None:
    labels, groups, sources = alphabet_set()
    perfect = np.eye(labels.max() + 1)[labels]
    assert one_shot_error(perfect, labels, groups, sources, episodes=50) == (0.0, 0.0, 0.0)
    noise = np.random.default_rng(0).normal(size=(len(labels), 16))
    error, low, high = one_shot_error(noise, labels, groups, sources, episodes=400, seed=3)
    assert low < error < high and low <= 0.95 <= high


def test_confidence_interval_is_the_normal_interval_of_the_episode_mean() -> None:
    values = np.array([0.0, 1.0] * 50)
    mean, low, high = mean_ci(values)
    half = 1.959963984540054 * values.std(ddof=1) / 10
    assert (mean, low, high) == pytest.approx((0.5, 0.5 - half, 0.5 + half))
    assert mean_ci(np.array([0.0, 0.05, 0.0]))[1] == 0.0  # clipped to [0, 1]
    assert mean_ci(np.array([-0.2, 0.0]), clip=None)[1] < -0.2  # differences are not clipped
    # coverage: intervals from 200-episode samples hold the true error about 95% of the time
    rng = np.random.default_rng(0)
    hits = [lo <= 0.1 <= hi for lo, hi in (mean_ci(rng.binomial(20, 0.1, 200) / 20)[1:] for _ in range(400))]
    assert 0.91 <= np.mean(hits) <= 0.99


def test_evaluate_reports_a_protocol_with_its_interval(capsys, tmp_path) -> None:
    labels, groups, sources = alphabet_set()
    x = np.eye(labels.max() + 1)[labels] + 0.01
    result = evaluate(x, labels, recall_k=(1,), with_nmi=False, one_shot_ways=20, one_shot_protocol="within_alphabet",
                      groups=groups, sources=sources, one_shot_episodes=30)
    assert result["one_shot_20way_within_alphabet"] == {"error": 0.0, "ci95": [0.0, 0.0], "episodes": 30}
    assert "one_shot_20way" not in result


def test_centred_episodes_match_a_direct_reference() -> None:
    labels, groups, sources = alphabet_set()
    rng = np.random.default_rng(5)
    style = {d: rng.normal(size=8) for d in set(sources)}  # each drawer's hand shifts its drawings
    x = np.stack([rng.normal(size=8) * 0.5 + np.eye(8)[c % 8] + style[d] for c, d in zip(labels, sources)])
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    for center in (0.0, 0.5, 1.0):
        errors = episode_errors(x, labels, groups, sources, 20, "within_alphabet", 60, seed=2, center=center)
        expected = []
        for support, query in within_alphabet_episodes(labels, groups, sources, 20, 60, 2):
            mean = center * x[support].mean(axis=0)
            wrong = 0
            for i, q in enumerate(query):  # cosine of each centred query to each centred support, one by one
                v = x[q] - mean
                cos = [float(v @ (x[s] - mean)) / np.linalg.norm(v) / np.linalg.norm(x[s] - mean) for s in support]
                wrong += int(np.argmax(cos) != i)
            expected.append(wrong / len(query))
        np.testing.assert_allclose(errors, expected)
    plain = episode_errors(x, labels, groups, sources, 20, "within_alphabet", 60, seed=2)
    centred = episode_errors(x, labels, groups, sources, 20, "within_alphabet", 60, seed=2, center=1.0)
    assert not np.array_equal(plain, centred)  # the example is one where centring changes answers
    with pytest.raises(ValueError, match="0 to 1"):
        one_shot_error(x, labels, groups, sources, episodes=5, center=1.5)


def test_evaluate_reports_the_center_it_used() -> None:
    labels, groups, sources = alphabet_set()
    x = np.eye(labels.max() + 1)[labels] + 0.01
    result = evaluate(x, labels, recall_k=(1,), with_nmi=False, one_shot_ways=20, one_shot_protocol="within_alphabet",
                      groups=groups, sources=sources, one_shot_episodes=30, center=0.5)
    assert result["one_shot_20way_within_alphabet"] == {"error": 0.0, "ci95": [0.0, 0.0], "episodes": 30,
                                                        "center": 0.5}
    assert "centred 0.5" in format_metrics(result) and "center" not in result  # only the episodes were centred
    with pytest.raises(ValueError, match="needs a gallery"):  # nothing to centre
        evaluate(x, labels, recall_k=(1,), with_nmi=False, center=0.5)


def test_a_centred_gallery_search_is_cosine_after_taking_off_the_gallery_mean() -> None:
    rng = np.random.default_rng(1)
    shift = 3.0 * rng.normal(size=6)  # every gallery image shares it: centring takes most of it off
    g, gl = rng.normal(size=(30, 6)) + shift, np.arange(30) % 10
    q, ql = g[:10] - shift + 0.3 * rng.normal(size=(10, 6)), np.arange(10)
    result = evaluate(q, ql, g, gl, recall_k=(1,), with_nmi=False, center=1.0)
    mean = g.mean(axis=0)
    cos = ((q - mean) / np.linalg.norm(q - mean, axis=1, keepdims=True)) @ (
        (g - mean) / np.linalg.norm(g - mean, axis=1, keepdims=True)).T
    assert result["center"] == 1.0
    assert result["recall_at_k"][1] == pytest.approx(np.mean(gl[cos.argmax(axis=1)] == ql))
    assert "centred      by 1 x the mean gallery embedding" in format_metrics(result)


def toy_set(n_classes: int = 3, per_class: int = 2) -> ImageSet:
    """Tiny asymmetric arrays, one class per value, with groups and sources."""
    items, labels = [], []
    for c in range(n_classes):
        for i in range(per_class):
            a = np.full((4, 6), 255, np.uint8)
            a[0, : c + 1] = 10 * i  # asymmetric: a transpose is visible
            items.append(a)
            labels.append(c)
    return ImageSet(items, np.array(labels), [f"c{c}" for c in range(n_classes)], mode="L",
                    groups=np.array(["g"] * len(items), dtype=object),
                    sources=np.array([f"{i % per_class}" for i in range(len(items))], dtype=object))


def test_rotated_copies_are_new_classes() -> None:
    base = toy_set()
    rotated = with_transformed_classes(base, ["rot90", "rot180", "rot270"])
    assert len(rotated) == 4 * len(base) and len(rotated.class_names) == 12
    assert rotated.class_names[3:6] == ["c0@rot90", "c1@rot90", "c2@rot90"]
    assert np.array_equal(rotated.labels, np.concatenate([base.labels + 3 * k for k in range(4)]))
    for k in range(4):  # copy k is the image rotated k x 90 degrees counter-clockwise
        got = np.asarray(rotated.load(k * len(base) + 5))
        assert np.array_equal(got, np.rot90(np.asarray(base.load(5)), k))
    part = rotated.subset([7, 1])
    assert np.array_equal(np.asarray(part.load(0)), np.asarray(rotated.load(7)))
    assert list(part.labels) == [3, 0] and list(part.groups) == ["g", "g"]
    assert with_transformed_classes(base, []) is base
    with pytest.raises(ValueError, match="rot90"):
        with_transformed_classes(base, ["rot45"])


def test_concat_sets_keeps_groups_and_sources_where_every_set_has_them() -> None:
    base = toy_set()
    a, b = base.subset([4, 0]), replace(base.subset([3, 5]), class_names=["c1", "c2", "c9"])
    both = concat_sets(a, b)
    assert both.class_names == ["c0", "c1", "c2", "c9"] and list(both.labels) == [2, 0, 2, 3]
    assert list(both.groups) == ["g"] * 4 and list(both.sources) == [str(i % 2) for i in (4, 0, 3, 5)]
    assert concat_sets(a, replace(b, sources=None)).sources is None


def test_swap_and_all_splits() -> None:
    split = load_split("digits")
    swapped = load_split("digits", split="swap")
    assert swapped.train.class_names == split.test.class_names and swapped.test.class_names == split.train.class_names
    final = resplit(split, "all")
    assert len(final.test) == 0 and len(final.train) == len(split.train) + len(split.test)
    assert final.train.class_names == sorted(split.train.class_names + split.test.class_names)
    assert sorted(set(final.train.labels.tolist())) == list(range(10))
    names = [final.train.class_names[k] for k in final.train.labels]
    assert names == [s.class_names[k] for s in (split.train, split.test) for k in s.labels]
    assert "final fit" in final.notes[-1]
    with pytest.raises(ValueError, match="swap"):
        resplit(split, "nope")


def test_final_fit_trains_on_every_class_and_keeps_the_last_epoch(tmp_path, capsys) -> None:
    from metricsearch.train.config import load_config
    from metricsearch.train.trainer import train

    config = load_config(None, [f"output_dir={tmp_path}", "epochs=2", "batches_per_epoch=2", "model.dim=16",
                                "split=all", "augment_classes=[rot180]"])
    result = train(config, progress=False)
    rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2] and not any("recall_at_k" in r for r in rows)  # no evaluation
    assert result.val_recall_at_1 is None and result.test is None  # nothing measured, and no sentinel says otherwise
    best = torch.load(result.run_dir / "best.pt", weights_only=False)
    last = torch.load(result.run_dir / "last.pt", weights_only=False)
    assert best["epoch"] == last["epoch"] == 2
    assert all(torch.equal(v, last["model"][k]) for k, v in best["model"].items())
    assert main(["export", str(result.run_dir), "--out", str(tmp_path / "m.onnx")]) == 0  # parity on train images
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["max_abs_diff"] <= 1e-4


def test_shifted_views_are_averaged_inside_the_exported_graph(tmp_path) -> None:
    from metricsearch.models.torch_embedder import build_embedder
    from metricsearch.models.onnx_embedder import OnnxEmbedder
    from metricsearch.train.export import export_onnx

    torch.manual_seed(0)
    shifts = [[0, 0], [1, 0], [-1, 0], [0, 1], [0, -2]]
    model = build_embedder({"dim": 16, "tta_shifts": shifts}).eval()
    assert model.config["tta_shifts"] == shifts
    x = torch.randn(3, 1, 28, 28)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2), mode="replicate")
    with torch.no_grad():  # view (dx, dy): content moves dx right, dy down; edges replicated
        views = [model._embed(padded[:, :, 2 - dy:30 - dy, 2 - dx:30 - dx]) for dx, dy in shifts]
        got = model(x)
    expected = torch.nn.functional.normalize(torch.stack(views).mean(0), dim=1)
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(views[1][:, :], model._embed(padded[:, :, 2:30, 1:29]))
    model.train()
    assert model(x).shape == (3, 16)  # training sees single views
    model.eval()
    batch = np.random.default_rng(0).normal(size=(5, 1, 28, 28)).astype(np.float32)
    export_onnx(model, tmp_path / "tta.onnx", batch)
    onnx_model = OnnxEmbedder(tmp_path / "tta.onnx", device="cpu")
    with torch.no_grad():
        expected = model(torch.from_numpy(batch)).numpy()
    assert np.abs(onnx_model.embed_arrays(batch) - expected).max() <= 1e-4
    assert np.abs(np.linalg.norm(onnx_model.embed_arrays(batch[:1]), axis=1) - 1).max() <= 1e-5
    assert [onnx_model.session.get_inputs()[0].name, onnx_model.session.get_outputs()[0].name] == ["images",
                                                                                                  "embeddings"]


def test_rotated_views_turn_the_image_about_its_centre() -> None:
    import math

    from metricsearch.models.torch_embedder import rotated

    torch.manual_seed(0)
    x = torch.randn(2, 1, 28, 28)
    torch.testing.assert_close(rotated(x, 0), x)
    torch.testing.assert_close(rotated(x, 90), torch.rot90(x, 1, (2, 3)), atol=1e-4, rtol=0)  # counterclockwise
    torch.testing.assert_close(rotated(x, -90), torch.rot90(x, -1, (2, 3)), atol=1e-4, rtol=0)
    wide = torch.randn(1, 1, 20, 32)  # about the centre in pixels, not in stretched coordinates
    torch.testing.assert_close(rotated(wide, 180), torch.rot90(wide, 2, (2, 3)), atol=1e-4, rtol=0)
    c, s = math.cos(math.radians(15)), math.sin(math.radians(15))  # torch's own affine sampling, for a square
    grid = torch.nn.functional.affine_grid(torch.tensor([[[c, -s, 0.0], [s, c, 0.0]]]).expand(2, 2, 3), x.shape,
                                           align_corners=False)
    expected = torch.nn.functional.grid_sample(x, grid, padding_mode="border", align_corners=False)
    torch.testing.assert_close(rotated(x, 15), expected, atol=1e-5, rtol=0)


def test_rotated_views_are_averaged_inside_the_exported_graph(tmp_path) -> None:
    from metricsearch.models.onnx_embedder import OnnxEmbedder
    from metricsearch.models.torch_embedder import build_embedder, load_embedder
    from metricsearch.train.export import export_onnx

    torch.manual_seed(0)
    model = build_embedder({"dim": 16, "tta_rotations": [90, -90]}).eval()
    assert model.config["tta_rotations"] == [90.0, -90.0]
    x = torch.randn(3, 1, 28, 28)
    with torch.no_grad():  # without shifts, the image itself is the first view
        views = [model._embed(v) for v in (x, torch.rot90(x, 1, (2, 3)), torch.rot90(x, -1, (2, 3)))]
        got = model(x)
    torch.testing.assert_close(got, torch.nn.functional.normalize(torch.stack(views).mean(0), dim=1),
                               atol=1e-4, rtol=0)
    model.train()
    assert model(x).shape == (3, 16)  # training sees single views
    model = build_embedder({"dim": 16, "tta_shifts": [[0, 0], [3, 0], [0, -3]], "tta_rotations": [-15, 15]}).eval()
    torch.save({**model.checkpoint(), "epoch": 1}, tmp_path / "m.pt")
    again = load_embedder(tmp_path / "m.pt").eval()
    assert (again.tta_shifts, again.tta_rotations) == ([(0, 0), (3, 0), (0, -3)], [-15.0, 15.0])
    batch = np.random.default_rng(0).normal(size=(5, 1, 28, 28)).astype(np.float32)
    export_onnx(model, tmp_path / "views.onnx", batch)
    onnx_model = OnnxEmbedder(tmp_path / "views.onnx", device="cpu")
    with torch.no_grad():
        expected = model(torch.from_numpy(batch)).numpy()
        single = model._embed(torch.from_numpy(batch)).numpy()
    assert np.abs(onnx_model.embed_arrays(batch) - expected).max() <= 1e-4
    assert np.abs(onnx_model.embed_arrays(batch[:2]) - expected[:2]).max() <= 1e-4  # any batch size
    assert np.abs(expected - single).max() > 1e-2  # the views change the embedding
    assert json.loads(onnx_model.metadata["model_config"])["tta_rotations"] == [-15.0, 15.0]


def test_set_views_switches_the_views_and_the_saved_config() -> None:
    from metricsearch.models.torch_embedder import build_embedder

    torch.manual_seed(0)
    model = build_embedder({"dim": 16, "tta_shifts": [[0, 0], [3, 0]], "tta_rotations": [15]}).eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        with_views = model(x)
        model.set_views([], [])
        assert "tta_shifts" not in model.config and "tta_rotations" not in model.config
        torch.testing.assert_close(model(x), model._embed(x))
        model.set_views([[0, 0], [3, 0]], [15])
        assert (model.config["tta_shifts"], model.config["tta_rotations"]) == ([[0, 0], [3, 0]], [15.0])
        torch.testing.assert_close(model(x), with_views)


def test_a_single_unshifted_view_is_the_plain_embedding() -> None:
    from metricsearch.models.torch_embedder import build_embedder

    torch.manual_seed(0)
    model = build_embedder({"dim": 8, "tta_shifts": [[0, 0]]}).eval()
    x = torch.randn(2, 1, 28, 28)
    with torch.no_grad():
        torch.testing.assert_close(model(x), model._embed(x))


def test_handwriting_augmentation_changes_stroke_width() -> None:
    from metricsearch.train.augment import build_augment

    image = Image.new("L", (28, 28), 255)
    image.paste(0, (10, 4, 13, 24))  # a vertical stroke, 3 px wide
    thick = build_augment({"name": "handwriting", "degrees": 0, "translate": [0, 0], "scale": [1, 1], "shear": 0,
                           "stroke": [1.0, 1.0]}, 28)(image)
    thin = build_augment({"name": "handwriting", "degrees": 0, "translate": [0, 0], "scale": [1, 1], "shear": 0,
                          "stroke": [-1.0, -1.0]}, 28)(image)
    ink = [(np.asarray(im) < 128).sum() for im in (thin, image, thick)]
    assert ink[0] < ink[1] < ink[2]
    torch.manual_seed(0)
    elastic = build_augment({"name": "handwriting", "elastic_p": 1.0}, 28)(image)
    assert elastic.size == (28, 28) and elastic.mode == "L"
    with pytest.raises(ValueError, match="elastic_bank"):
        build_augment({"name": "handwriting", "elastic_p": 0.5, "elastic_bank": 0}, 28)


def test_handwriting_elastic_distortion_applies_one_field_of_its_bank() -> None:
    """The distortion is one of the precomputed displacement fields (or its negation): the output equals
    torchvision's elastic transform with that field, and different draws use different fields."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional

    from metricsearch.train.augment import build_augment

    image = Image.new("L", (28, 28), 255)
    image.paste(0, (10, 4, 13, 24))
    plain = {"degrees": 0, "translate": [0, 0], "scale": [1, 1], "shear": 0, "stroke": [0, 0]}
    torch.manual_seed(0)
    augment = build_augment({"name": "handwriting", **plain, "elastic_p": 1.0, "elastic_bank": 4}, 28)
    assert augment.fields.shape == (4, 28, 28, 2)
    candidates = [np.asarray(functional.elastic_transform(image, (sign * f)[None], InterpolationMode.BILINEAR, 255))
                  for f in augment.fields for sign in (1, -1)]
    seen = set()
    for _ in range(40):
        out = np.asarray(augment(image))
        assert not np.array_equal(out, np.asarray(image))
        matches = [i for i, c in enumerate(candidates) if np.array_equal(out, c)]
        assert matches
        seen.add(matches[0])
    assert len(seen) > 4  # fields and signs vary from image to image
    bigger = Image.new("L", (56, 56), 255)
    bigger.paste(0, (20, 8, 26, 48))
    assert augment(bigger).size == (56, 56)  # a field drawn at 28 px is resized to the image
    with pytest.raises(ValueError, match="nope"):
        build_augment({"name": "handwriting", "nope": 1}, 28)


def test_small_resnet_embeds_to_dim() -> None:
    from metricsearch.models.torch_embedder import build_embedder

    model = build_embedder({"backbone": "small_resnet", "dim": 24, "backbone_params": {"width": 16}}).eval()
    with torch.no_grad():
        out = model(torch.randn(2, 1, 28, 28))
    assert out.shape == (2, 24)
    torch.testing.assert_close(out.norm(dim=1), torch.ones(2))


def test_omniglot_images_carry_alphabet_and_drawer(omniglot_dir) -> None:
    split = load_split(f"omniglot:{omniglot_dir}")
    test = split.test
    assert sorted(set(test.groups)) == ["Early_Aramaic", "Japanese_(katakana)", "Latin", "Tagalog"]
    assert sorted(set(test.sources)) == [f"{d:02d}" for d in range(1, 21)]
    name = test.class_names[test.labels[0]]
    assert name.split("/")[0] == test.groups[0]
    final = load_split(f"omniglot:{omniglot_dir}", split="all")
    assert len(final.train) == 4840 and len(final.train.class_names) == 242 and len(final.test) == 0
    error, low, high = one_shot_error(np.eye(len(test.class_names))[test.labels], test.labels, test.groups,
                                      test.sources, episodes=20)
    assert error == 0.0


def test_cli_reports_the_within_alphabet_error(omniglot_dir, capsys) -> None:
    argv = ["evaluate", "--model", "pixels", "--dataset", f"omniglot:{omniglot_dir}", "--no-nmi",
            "--one-shot-ways", "20", "--one-shot-protocol", "within_alphabet"]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    within = result["one_shot_20way_within_alphabet"]
    assert 0.6 < within["error"] < 0.9 and within["ci95"][0] < within["error"] < within["ci95"][1]
    assert main(argv) == 0
    assert "95% CI" in capsys.readouterr().out
    assert main([*argv, "--center", "0.5", "--json"]) == 0
    centred = json.loads(capsys.readouterr().out)["one_shot_20way_within_alphabet"]
    assert centred["center"] == 0.5 and centred["error"] != within["error"]


@pytest.mark.parametrize("extra, message", [
    (["--one-shot-ways", "20", "--one-shot-protocol", "within_alphabet", "--center", "1.5"], "0 to 1"),
    (["--center", "0.5"], "one_shot_ways and one_shot_protocol"),
])
def test_cli_rejects_a_bad_center_in_one_line(omniglot_dir, capsys, extra, message) -> None:
    assert main(["evaluate", "--model", "pixels", "--dataset", f"omniglot:{omniglot_dir}", "--no-nmi", *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err
