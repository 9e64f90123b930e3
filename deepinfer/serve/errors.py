"""Errors in the OpenAI shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """An error the HTTP layer answers with ``status`` and the OpenAI error body.

    ``param`` names the request field at fault (clients such as the ``openai`` package show
    it), ``type`` follows OpenAI's names (``invalid_request_error``, ...).
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def unsupported(param: str, why: str = "is not supported by this server") -> APIError:
    return APIError(400, f"{param} {why}", param=param, code="unsupported_parameter")


def model_not_found(model: str) -> APIError:
    return APIError(
        404,
        f"The model {model!r} does not exist; GET /v1/models lists the served model",
        type="not_found_error",
        param="model",
        code="model_not_found",
    )


def overloaded(reason: str) -> APIError:
    return APIError(
        429,
        f"request rejected by admission control: {reason}",
        type="rate_limit_error",
        code="rate_limit_exceeded",
    )


def unavailable(message: str) -> APIError:
    return APIError(503, message, type="service_unavailable", code="service_unavailable")


def server_error(message: str) -> APIError:
    return APIError(500, message, type="server_error", code="internal_error")
