"""A request failed for its input: the engine's ValueErrors name the field first ('max_tokens: ...').
The server answers them with a 400 naming that field; the engine logs them without a traceback."""


def names_a_field(e: ValueError) -> bool:
    """Whether the message starts with a field name ('max_tokens: ...'), as our ValueErrors do."""
    head, colon, _ = str(e).partition(":")
    return bool(colon and head.strip()) and " " not in head.strip()


def is_input_error(e: BaseException) -> bool:
    return isinstance(e, ValueError) and names_a_field(e)
