"""The Python SDK (`gpufleet.Client`) and the HTTP transport the CLI shares with it; it imports nothing of the
server, the scheduling core or the adapters: only the error tree and httpx."""

from gpufleet.client.sdk import ApplyResult, ArrayStatus, BulkResult, Client, ConfigChange, Job, JobTimeoutError
from gpufleet.client.transport import ApiError

__all__ = ["ApiError", "ApplyResult", "ArrayStatus", "BulkResult", "Client", "ConfigChange", "Job", "JobTimeoutError"]
