"""The OpenAI-compatible API (chat completions, responses, models) as one more channel."""
