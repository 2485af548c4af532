"""A byte tokenizer for the tiny random models of the pretrained tests (no download, no
package): UTF-8 bytes as token ids (vocabulary 256), with the calls the analysis runner and
the retrain code make."""
import torch


class ByteTokenizer:
    """UTF-8 bytes as token ids (vocabulary 256)."""

    pad_token_id = 0

    def __call__(self, text, return_tensors=None, add_special_tokens=True):
        ids = list(text.encode("utf-8"))
        if return_tensors == "pt":
            t = torch.tensor([ids])
            return {"input_ids": t, "attention_mask": torch.ones_like(t)}
        return {"input_ids": ids}

    def decode(self, ids):
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")
