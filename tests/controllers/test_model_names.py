"""The served model's size from its name (``controllers.online.model_names``): the sizes
real checkpoints state, mixtures and active-parameter suffixes, and the look-alikes that
are not sizes (versions, dates, context lengths, quantisations, GPUs)."""

from __future__ import annotations

import pytest

from gpugov.controllers.online.model_names import (
    EXPERTS_PER_TOKEN,
    SHARED_FRACTION,
    ModelSize,
    hints_from_model_name,
)


@pytest.mark.parametrize(
    ("name", "params_b"),
    [
        ("meta-llama/Llama-3.1-70B-Instruct", 70.0),
        ("meta-llama/Llama-3.1-405B-Instruct-FP8", 405.0),
        ("Qwen/Qwen2.5-14B-Instruct", 14.0),  # "2.5" is a version
        ("Qwen/Qwen2.5-0.5B-Instruct", 0.5),
        ("Qwen/Qwen2.5-1.5B", 1.5),
        ("mistralai/Mistral-7B-Instruct-v0.3", 7.0),  # "v0.3" is a version
        ("TheBloke/Llama-2-13B-chat-GPTQ-4bit", 13.0),  # "4bit" is a quantisation
        ("EleutherAI/gpt-j-6b", 6.0),  # lower case
        ("open_llama_3b_v2", 3.0),  # underscores
        ("mistralai/Mistral-Small-24B-Instruct-2501", 24.0),  # "2501" is a date
        ("Qwen/Qwen2.5-7B-Instruct-1M", 7.0),  # "1M" is a context length
        ("HuggingFaceTB/SmolLM2-135M", 0.135),  # millions
        ("deepseek-ai/DeepSeek-R1-Distill-Llama-70B", 70.0),  # dense, not DeepSeek-R1's
        ("deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B", 1.5),
        ("Llama-3.2-3B-Instruct (BF16, TP=1)", 3.0),  # a bundled profile's model
        ("llama-7b-A100-tuned", 7.0),  # "A100" is a GPU, not an active size
        ("Qwen/Qwen-1_8B-Chat", 1.8),  # an underscore for the decimal point
        ("internlm/internlm2_5-1_8b-chat", 1.8),  # "2_5" is a version
        ("stabilityai/stablelm-2-1_6b", 1.6),
        ("Qwen2_5_7B_Instruct", 7.0),  # "2_5" a version in an underscored name
    ],
)
def test_a_dense_size(name: str, params_b: float) -> None:
    assert hints_from_model_name(name) == ModelSize(params_b, params_b)


@pytest.mark.parametrize(
    ("name", "experts", "base"),
    [
        ("mistralai/Mixtral-8x7B-Instruct-v0.1", 8, 7.0),
        ("mistralai/Mixtral-8x22B-Instruct-v0.1", 8, 22.0),
        ("Mixtral-8x7B-Instruct-v0.1 (BF16, MoE 8 experts top-2)", 8, 7.0),
    ],
)
def test_a_mixture_of_experts(name: str, experts: int, base: float) -> None:
    size = hints_from_model_name(name)
    assert size is not None
    shared = SHARED_FRACTION * base
    assert size.params_b == pytest.approx(shared + experts * (base - shared), abs=1e-3)
    assert size.active_params_b == pytest.approx(
        shared + EXPERTS_PER_TOKEN * (base - shared), abs=1e-3
    )


def test_the_mixtral_sizes_are_close_to_the_published_ones() -> None:
    # Mixtral-8x7B: 46.7B in all, 12.9B active; 8x22B: 141B, 39B.
    small = hints_from_model_name("mistralai/Mixtral-8x7B-v0.1")
    large = hints_from_model_name("mistralai/Mixtral-8x22B-v0.1")
    assert small is not None and large is not None
    assert small.params_b == pytest.approx(46.7, rel=0.05)
    assert small.active_params_b == pytest.approx(12.9, rel=0.05)
    assert large.params_b == pytest.approx(141.0, rel=0.05)
    assert large.active_params_b == pytest.approx(39.0, rel=0.05)


@pytest.mark.parametrize(
    ("name", "params_b", "active_params_b"),
    [
        ("Qwen/Qwen3-30B-A3B", 30.0, 3.0),
        ("Qwen/Qwen3-235B-A22B-Instruct-2507", 235.0, 22.0),
        ("qwen3-30b-a3b", 30.0, 3.0),
    ],
)
def test_an_active_parameter_suffix(name: str, params_b: float, active_params_b: float) -> None:
    assert hints_from_model_name(name) == ModelSize(params_b, active_params_b)


@pytest.mark.parametrize(
    "name",
    [
        "microsoft/phi-4",  # no size in the name
        "acme/Sparse-17B-16E",  # an active size beside an experts count, no total
        "microsoft/Phi-3-mini-128k-instruct",  # a context length only
        "Qwen/Qwen1.5-MoE-A2.7B",  # active parameters with no total: ambiguous
        "my-model-2024-05-13",  # a date
        "mistral-v0.1",  # a version
        "model-bf16-int4",
        "Qwen/Qwen2.5-Turbo-1M",  # 1M: a context length, not a model of a million
        "gpt-4o",
        "",
        None,
    ],
)
def test_no_size_stated(name: str | None) -> None:
    assert hints_from_model_name(name) is None


def test_several_sizes_give_the_largest_and_a_nonsense_size_none() -> None:
    assert hints_from_model_name("teacher-70B-student-8B") == ModelSize(70.0, 70.0)
    assert hints_from_model_name("model-99999B") is None  # beyond any real model
    # An active size above the total is not taken.
    assert hints_from_model_name("model-7B-A13B") == ModelSize(7.0, 7.0)


@pytest.mark.parametrize(
    ("name", "params_b", "active_params_b"),
    [
        ("openai/gpt-oss-120b", 117.0, 5.1),  # the name states the total, rounded
        ("openai/gpt-oss-20b", 21.0, 3.6),
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 109.0, 17.0),  # 17B is the active
        ("meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8", 400.0, 17.0),
        ("deepseek-ai/DeepSeek-V3", 671.0, 37.0),  # no size in the name
        ("deepseek-ai/DeepSeek-R1-0528", 671.0, 37.0),
        ("deepseek-ai/DeepSeek-V2-Lite-Chat", 15.7, 2.4),
        ("deepseek-ai/DeepSeek-V2.5", 236.0, 21.0),
        ("moonshotai/Kimi-K2-Instruct", 1000.0, 32.0),
        ("zai-org/GLM-4.5-Air-FP8", 106.0, 12.0),
        ("zai-org/GLM-4.5", 355.0, 32.0),
    ],
)
def test_a_mixture_whose_name_hides_a_size_gets_its_published_sizes(
    name: str, params_b: float, active_params_b: float
) -> None:
    # Read by the size rule these would be dense (gpt-oss-120b: 120B active, 23 times
    # the 5.1B each token reads) or have no hint at all.
    assert hints_from_model_name(name) == ModelSize(params_b, active_params_b)


@pytest.mark.parametrize(
    ("name", "params_b", "active_params_b"),
    [
        # A distilled model named after its teacher states its own, dense size.
        ("deepseek-ai/DeepSeek-R1-0528-Qwen3-8B", 8.0, 8.0),
        ("deepseek-r1:70b", 70.0, 70.0),  # an Ollama-style tag of the Llama-70B distill
        # The same families, spelled with other separators, are still the mixtures.
        ("gpt-oss:120b", 117.0, 5.1),
        ("gpt_oss_120b", 117.0, 5.1),
        ("openai/gpt-oss-safeguard-120b", 117.0, 5.1),  # gpt-oss-120b fine-tuned
        ("openai/gpt-oss-safeguard-20b", 21.0, 3.6),
        ("deepseek-r1:671b", 671.0, 37.0),  # the name's size is the published total
        # Mixtures whose names state one size or state it otherwise.
        ("ibm-granite/granite-3.0-3b-a800m-instruct", 3.0, 0.8),  # active in millions
        ("allenai/OLMoE-1B-7B-0924-Instruct", 6.9, 1.3),  # active size first
        ("deepseek-ai/DeepSeek-Prover-V2-671B", 671.0, 37.0),  # DeepSeek-V3's base
        # Mixtures named by their total alone (Ollama-style tags), and the Coder-V2 family.
        ("deepseek-v2:16b", 15.7, 2.4),  # V2-Lite
        ("deepseek-v2:236b", 236.0, 21.0),
        ("deepseek-coder-v2:16b", 15.7, 2.4),
        ("deepseek-ai/DeepSeek-Coder-V2-Lite-Instruct", 15.7, 2.4),
        ("deepseek-ai/DeepSeek-Coder-V2-Instruct", 236.0, 21.0),
        ("qwen3:30b", 30.5, 3.3),  # Qwen3-30B-A3B: Qwen3 has no dense 30B
        ("qwen3:235b", 235.0, 22.0),
        ("qwen3-coder:30b", 30.5, 3.3),
        ("qwen3-coder:480b", 480.0, 35.0),
        ("Qwen/Qwen3-32B", 32.0, 32.0),  # dense
        ("Qwen/Qwen3-Coder-30B-A3B-Instruct", 30.0, 3.0),  # states both: read as stated
        # Llama 4 as Ollama tags it: 16 (128) experts of the 17B active, not an NxMB
        # mixture of 17B experts (216B / 1,701B in all).
        ("llama4:16x17b", 109.0, 17.0),
        ("llama4:128x17b", 400.0, 17.0),
        ("llama4:scout", 109.0, 17.0),
        ("Llama4-Scout-17B", 109.0, 17.0),
    ],
)
def test_a_name_is_never_priced_as_another_model(
    name: str, params_b: float, active_params_b: float
) -> None:
    assert hints_from_model_name(name) == ModelSize(params_b, active_params_b)


@pytest.mark.parametrize(
    "name",
    [
        "deepseek-ai/deepseek-moe-16b-chat",  # 16.4B in all, 2.8B active
        "jetmoe/jetmoe-8b",  # 8B in all, 2.2B active
        "llama-moe/LLaMA-MoE-v1-3_5B-2_8",  # names its 3.5B active, of 6.7B
        "Sparse-MoE-7B",
    ],
)
def test_a_mixture_that_states_one_size_gives_none(name: str) -> None:
    # Its one size may be the total or the active one: priced as a dense model of that
    # size, a token read up to six times the parameters it does.
    assert hints_from_model_name(name) is None


@pytest.mark.parametrize(
    ("name", "size"),
    [
        # A page that serves several models names them all, joined with commas: sizes
        # taken across them made a model none of them is (70B with Qwen3's 3B active).
        ("Qwen/Qwen3-30B-A3B,meta-llama/Llama-3.1-70B-Instruct", None),
        ("meta-llama/Llama-3.1-8B,openai/gpt-oss-120b", None),
        ("meta-llama/Llama-3.1-8B,mistralai/Mixtral-8x7B-v0.1", None),
        ("meta-llama/Llama-3.1-8B-Instruct,my-adapter", None),  # one states no size
        # Models of one size are that size.
        ("meta-llama/Llama-3.1-8B-Instruct,meta-llama/Llama-3.1-8B", ModelSize(8.0, 8.0)),
        ("openai/gpt-oss-120b,openai/gpt-oss-safeguard-120b", ModelSize(117.0, 5.1)),
    ],
)
def test_several_models_give_a_size_only_where_they_share_it(
    name: str, size: ModelSize | None
) -> None:
    assert hints_from_model_name(name) == size
