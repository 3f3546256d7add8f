"""Question generation: a generator fine-tuned on (passage -> question) pairs."""
