"""benchmarks.quality.frozen_features, the diagnosis behind docs/electra-recipe.md's "Why ELECTRA fine-tunes
worse this early": its measures on features whose answer is known, then a checkpoint read end to end."""

import json

import torch


def test_frozen_features_measure_spread_rarity_and_a_linear_read_out(tiny_init, tmp_path, registry_data):
    from benchmarks.quality import frozen_features as ff

    g = torch.Generator().manual_seed(0)
    line = torch.randn(200, 1, generator=g) * torch.randn(1, 16, generator=g)  # every row on one direction
    assert ff.spread(line)["top_pc_share"] > 0.99 and ff.spread(line)["effective_rank"] < 1.01
    assert ff.spread(torch.randn(4000, 16, generator=g))["effective_rank"] > 14
    assert ff.spread(torch.ones(5, 4)) == {"top_pc_share": None, "effective_rank": None}  # no direction
    y = torch.randint(0, 3, (400,), generator=g)
    apart = torch.randn(400, 8, generator=g) + 4 * torch.eye(8)[y]  # each class shifted along its own axis
    assert ff.linear_probe(apart[:300], y[:300], apart[300:], y[300:], 3) > 0.9
    noise = torch.randn(400, 8, generator=g)
    assert ff.linear_probe(noise[:300], y[:300], noise[300:], y[300:], 3) < 0.6
    # Token 5 is in both texts, 7 in one: the second text is the rarer; [CLS] and [SEP] do not count.
    common, rarer, empty = ff.rarity([[101, 5, 102], [101, 5, 7, 102], [101, 102]])
    assert rarer > common > 0 and empty == 0
    # |r| either way; undefined, not NaN in the JSON, where one side does not vary (texts of one length).
    assert ff.correlation([1.0, 2.0, 3.0], [-2.0, -4.0, -6.0]) == 1.0
    assert ff.correlation([1.0, 2.0, 3.0], [4, 4, 4]) is None and "n/a" in ff.table(
        [{"checkpoint": "c", "layers": [{"top_pc_share": 0.5, "effective_rank": 2.0}],
          "first_direction_vs_rarity": 0.3, "first_direction_vs_length": None, "probe_cls_accuracy": 0.6,
          "probe_mean_accuracy": 0.6, "majority_share": 0.3}])  # fmt: skip

    out = tmp_path / "ff.json"
    assert ff.main([str(tiny_init), "--task", "trec", "--data-dir", str(registry_data), "--threads", "1",
                    "--max-train-examples", "300", "--out", str(out)]) == 0  # fmt: skip
    (result,) = json.loads(out.read_text())["results"]
    layers = json.loads((tiny_init / "config.json").read_text())["num_hidden_layers"]
    assert [layer["layer"] for layer in result["layers"]] == list(range(layers))
    assert all(0 < layer["top_pc_share"] < 1 and layer["effective_rank"] >= 1 for layer in result["layers"])
    assert 0 <= result["first_direction_vs_rarity"] <= 1 and 0 <= result["first_direction_vs_length"] <= 1
    assert result["probe_split"] == "test" and 0 < result["majority_share"] < 1
    low, high = result["first_direction_ends"]
    assert len(low) == len(high) == ff.ENDS and not set(low) & set(high)
    # Random weights still pass the words through: a linear read-out beats the majority class on TREC.
    assert result["probe_cls_accuracy"] > result["majority_share"]
