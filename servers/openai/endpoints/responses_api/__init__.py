"""The OpenAI Responses API (POST /v1/responses): input items, output objects, streaming events."""
