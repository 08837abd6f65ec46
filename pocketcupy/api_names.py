"""Arguments the library takes by vLLM's names as well as its own."""


def vllm_named(ours, theirs, name: str, their_name: str):
    """An argument given by our name or by vLLM's LLM's (sampling_params, pooling_params), not both."""
    if theirs is None:
        return ours
    if ours is not None:
        raise ValueError(f"{their_name}: given together with {name} (the same argument)")
    return theirs
