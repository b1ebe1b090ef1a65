"""The runtime's API error: an HTTP status rendered in OpenAI's error shape."""
from __future__ import annotations

MAX_MESSAGE_CHARS = 400  # no error message is longer, whatever input it describes


class APIError(Exception):
    """``{"error": {"message", "type", "param", "code"}}`` with a status and optional headers.

    The message is made safe on the way in (escaped to ASCII where it is not valid
    Unicode, cut to ``MAX_MESSAGE_CHARS``), so no input can make the error itself fail
    or echo a megabyte back.
    """

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, err_type: str = "invalid_request_error",
                 headers: dict[str, str] | None = None):
        message = _bounded(message)
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        if param is not None:
            self.param = _bounded(param, 80)
        self.err_type, self.headers = err_type, headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.err_type, "param": self.param, "code": self.code}}


def _bounded(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if len(text) <= limit else text[:limit - 3] + "..."
