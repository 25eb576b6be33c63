//! The fake's answers in Gemini's words: a `GenerateContentResponse` (`candidates`,
//! `usageMetadata`, `modelVersion`), whole or as `streamGenerateContent?alt=sse` sends
//! it: a chunk per piece of text, each with the usage so far (the prompt), the last
//! with its `finishReason` and the whole usage.

use serde_json::{json, Value};

use super::reply::{End, Reply};

impl Reply<'_> {
    /// `usageMetadata`: `n.input` prompt tokens (of them `n.third` cached), `n.output`
    /// output tokens (of them `n.fourth` thoughts).
    fn gemini_usage(&self) -> Value {
        let n = self.n;
        let cached = n.third.min(n.input);
        let thoughts = n.fourth.min(n.output);
        let mut u = json!({"promptTokenCount": n.input,
                           "candidatesTokenCount": n.output - thoughts,
                           "totalTokenCount": n.input + n.output,
                           "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n.input}]});
        if cached > 0 {
            u["cachedContentTokenCount"] = json!(cached);
        }
        if thoughts > 0 {
            u["thoughtsTokenCount"] = json!(thoughts);
        }
        u
    }

    fn finish(&self) -> &'static str {
        if self.end == End::AtLimit {
            "MAX_TOKENS"
        } else {
            "STOP"
        }
    }

    fn candidate(&self, text: &str, finish: Option<&str>) -> Value {
        let mut c = json!({"content": {"parts": [{"text": text}], "role": "model"}, "index": 0});
        if let Some(f) = finish {
            c["finishReason"] = json!(f);
        }
        c
    }

    /// The whole answer.
    pub(super) fn gemini(&self) -> Value {
        json!({"candidates": [self.candidate(self.text, Some(self.finish()))],
               "usageMetadata": self.gemini_usage(),
               "modelVersion": self.model, "responseId": "fake-gemini"})
    }

    /// The stream's chunks: the text in pieces, each with the prompt's usage only; the
    /// last says why it ended and the whole usage.
    pub(super) fn gemini_chunks(&self, pieces: usize) -> Vec<(Option<&'static str>, Value)> {
        let deltas = self.deltas(pieces);
        let last = deltas.len().saturating_sub(1);
        deltas
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let (finish, usage) = if i == last {
                    (Some(self.finish()), self.gemini_usage())
                } else {
                    (
                        None,
                        json!({"promptTokenCount": self.n.input, "totalTokenCount": self.n.input}),
                    )
                };
                (
                    None,
                    json!({"candidates": [self.candidate(d, finish)], "usageMetadata": usage,
                           "modelVersion": self.model, "responseId": "fake-gemini"}),
                )
            })
            .collect()
    }
}
