"""The one exception the numeric core raises for parameter values it cannot serve."""


class ParameterError(ValueError):
    """A parameter value outside what the encoding family (or its reference) defines.

    `parameter` names the offending parameter as the API spells it, so the service can report it
    (HTTP 422) without knowing the math.
    """

    def __init__(self, parameter: str, message: str) -> None:
        super().__init__(f"{parameter}: {message}")
        self.parameter = parameter
        self.message = message
