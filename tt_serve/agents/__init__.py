"""What agents need from the chat endpoint: tool-call and reasoning parsing of the model's text,
and grammars (llguidance) that constrain it to a JSON schema or to Qwen's tool-call format."""
