"""What a Flower node hands a protocol from its data file (no flwr needed)."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust import ValidationError
from fedclust.flower.dataio import load_device_file, save_device_file
from fedclust.kfed import KFedProtocol
from fedclust.core.protocol import Request
from fedclust.gauss import GaussClassifierProtocol



def test_a_file_with_labels_serves_a_clustering_protocol(tmp_path):
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (30, 3)), rng.normal(8, 1, (30, 3))])
    y = np.repeat([0, 1], 30)
    save_device_file(tmp_path / "dev.npz", (X, y), device_id=4)
    data, z = load_device_file(tmp_path / "dev.npz")
    assert z == 4 and isinstance(data, tuple)
    proto = KFedProtocol(2, 2)
    got = proto.node_data(data, "device 4")
    np.testing.assert_array_equal(got, X)
    # the reply is the one the same device gives without labels in its file
    a = proto.client_step(Request(0, "local_centers"), got, device_id=4, seed=1, state={})
    b = proto.client_step(Request(0, "local_centers"), X, device_id=4, seed=1, state={})
    np.testing.assert_array_equal(a.centers, b.centers)


def test_unlabelled_file_for_a_supervised_protocol_and_table_without_schema(tmp_path):
    pd = pytest.importorskip("pandas")
    save_device_file(tmp_path / "dev.npz", np.zeros((5, 2)))
    data, _ = load_device_file(tmp_path / "dev.npz")
    proto = GaussClassifierProtocol(classes=[0, 1], n_features=2)
    with pytest.raises(ValidationError, match="needs labels; the data file has no 'y'"):
        proto.node_data(data, "device 0")
    pd.DataFrame({"a": [1.0, 2.0]}).to_csv(tmp_path / "site.csv", index=False)
    table, _ = load_device_file(tmp_path / "site.csv")
    with pytest.raises(ValidationError, match="needs the site schema"):
        KFedProtocol(2, 1).node_data(table, "device 0")


def test_a_users_npz_site_file_serves_a_protocol_that_takes_numbers(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(12, 3))
    y = np.arange(12) % 2
    np.savez(tmp_path / "site.npz", X=X, y=y, feature_names=np.array(["u", "v", "w"]))
    table, _ = load_device_file(tmp_path / "site.npz")
    assert not isinstance(table, (tuple, np.ndarray))  # read as the site's table
    # the clustering protocol gets X, column by column as saved, labels dropped
    np.testing.assert_array_equal(KFedProtocol(2, 1).node_data(table, "device 0"), X)
    # the classifier gets X and y
    got_X, got_y = GaussClassifierProtocol(classes=[0, 1], n_features=3).node_data(table, "d")
    np.testing.assert_array_equal(got_X, X)
    np.testing.assert_array_equal(got_y, y)


def test_a_site_table_travels_to_a_simulated_node_and_site_protocols_take_it_whole(tmp_path):
    import json

    pd = pytest.importorskip("pandas")
    from fedclust.sites.transform import SiteTransformProtocol

    pd.DataFrame({"a": [1.5, None, 3.0], "kind": ["x", None, "y"]}).to_csv(
        tmp_path / "north.csv", index=False)
    table, _ = load_device_file(tmp_path / "north.csv")
    save_device_file(tmp_path / "dev-3.npz", table, device_id=3)
    back, z = load_device_file(tmp_path / "dev-3.npz")
    assert z == 3 and (back.name, back.path, back.features) == (table.name, table.path,
                                                                 table.features)
    np.testing.assert_array_equal(back.columns["a"], table.columns["a"])
    assert back.columns["kind"].tolist() == ["x", None, "y"]
    # a protocol run on site data encodes the table itself: the node hands it over unchanged
    wrapped = SiteTransformProtocol("kfed", json.dumps(KFedProtocol(2, 1).config()),
                                    mean=[0.0], scale=[1.0])
    assert wrapped.node_data(back, "device 3") is back
    with pytest.raises(ValidationError, match="needs the site schema"):
        KFedProtocol(2, 1).node_data(back, "device 3")
