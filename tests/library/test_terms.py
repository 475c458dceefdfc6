"""One vocabulary: every behaviour check is the same check, statuses are one enum."""

import json

import pytest
import torch

import loadkit
from loadkit import LoadkitError
from loadkit.errors import BehaviourError
from loadkit.terms import ENTRY_STATUSES, KEY_STATUSES, PARAM_STATUSES, Status


def _calls():
    from loadkit import as_pooling_model, get_numel_loaded, initialize_layerwise_reload
    from loadkit.models.plamo2 import Plamo2Config, Plamo2ForCausalLM
    from loadkit.pooling.probe import lookup_name, predict_probe

    args = __import__("inspect").signature(lambda param: None).bind(torch.zeros(1))
    return {
        "as_pooling_model": lambda b: as_pooling_model(torch.nn.Module, behaviour=b),
        "get_numel_loaded": lambda b: get_numel_loaded(lambda param: None, args, behaviour=b),
        "initialize_layerwise_reload": lambda b: initialize_layerwise_reload(
            torch.nn.Linear(1, 1), behaviour=b
        ),
        "lookup_name": lambda b: lookup_name("x", None, b),
        "predict_probe": lambda b: predict_probe([("x", 1)], {"x"}, behaviour=b),
        "Plamo2ForCausalLM": lambda b: Plamo2ForCausalLM(Plamo2Config(), behaviour=b),
    }


@pytest.mark.parametrize("entry", sorted(_calls()))
def test_every_behaviour_argument_is_checked_by_the_one_check(entry):
    with pytest.raises(BehaviourError, match=r"behaviour must be .*'old'.*not 'newer'") as err:
        _calls()[entry]("newer")
    assert isinstance(err.value, LoadkitError) and isinstance(err.value, ValueError)


def test_the_public_error_base_is_exported_at_the_top():
    assert loadkit.LoadkitError is LoadkitError
    assert "LoadkitError" in loadkit.__all__


def test_statuses_read_as_their_plain_words():
    assert Status.MAPPER_DROPPED == "dropped by mapper"
    assert f"{Status.NEVER_LOADED}" == str(Status.NEVER_LOADED) == "never loaded"
    assert repr(Status.LOADED) == "'loaded'"  # printed records look as they did with strings
    assert json.dumps({Status.SKIPPED: [Status.UNEXPECTED]}) == '{"skipped": ["unexpected"]}'
    assert len(set(KEY_STATUSES)) == len(KEY_STATUSES) == 9
    assert set(ENTRY_STATUSES) < set(KEY_STATUSES) and Status.NEVER_LOADED in PARAM_STATUSES
    assert set(Status) == set(KEY_STATUSES) | set(PARAM_STATUSES)
