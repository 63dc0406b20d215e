"""`APIError`: an HTTP error in OpenAI's shape (raised by protocol.py, tools.py, the app and the worker)."""
from __future__ import annotations


class APIError(Exception):
    """An HTTP error in OpenAI's shape."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type_: str | None = None, headers: dict | None = None):
        super().__init__(" ".join(str(message).split()))
        self.status, self.param, self.code, self.headers = status, param, code, headers or {}
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")

    @property
    def message(self) -> str:
        return str(self)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
