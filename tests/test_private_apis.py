"""The adapters around other libraries' private APIs check them before use (``_runtime.private_apis``)."""

from __future__ import annotations

import pytest
import torch

from episodestream._runtime import private_apis


def test_the_storage_use_count_counts_views_here():
    count = private_apis.storage_use_count()
    assert count is not None, "this PyTorch's storage use count failed the adapter's check"
    tensor = torch.empty(4)
    alone = count(tensor.untyped_storage())
    views = [tensor[:2], tensor.view(2, 2)]
    assert count(tensor.untyped_storage()) == alone + 2
    del views
    assert count(tensor.untyped_storage()) == alone


def test_a_use_count_that_behaves_otherwise_is_not_used(monkeypatch):
    private_apis.storage_use_count.cache_clear()
    monkeypatch.setattr(torch._C, "_storage_Use_Count", lambda cdata: 1, raising=False)
    try:
        assert private_apis.storage_use_count() is None
    finally:
        private_apis.storage_use_count.cache_clear()


def test_torchdata_state_keys_are_the_installed_torchdatas_and_a_renamed_one_is_refused(monkeypatch):
    pytest.importorskip("torchdata.stateful_dataloader", reason="torchdata is a test extra")
    from torchdata.stateful_dataloader import stateful_dataloader

    private_apis.torchdata_state_keys.cache_clear()
    assert private_apis.torchdata_state_keys() == private_apis.TORCHDATA_KEYS
    private_apis.torchdata_state_keys.cache_clear()
    monkeypatch.setattr(stateful_dataloader._StatefulMultiProcessingDataLoaderIter, "_SNAPSHOT", "_renamed")
    try:
        with pytest.raises(RuntimeError, match=r"torchdata .* lays out StatefulDataLoader states otherwise .*"
                                               r"'snapshot': '_renamed'"):
            private_apis.torchdata_state_keys()
    finally:
        private_apis.torchdata_state_keys.cache_clear()
