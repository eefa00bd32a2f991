"""Embeddings: deterministic unit vectors in both encodings the OpenAI client uses."""

from __future__ import annotations

import math

from .support import openai_client


async def test_embeddings_are_deterministic_unit_vectors_of_the_configured_dim(start_simulator):
    sim = await start_simulator(embedding_dim=16)
    async with openai_client(sim) as client:
        # The official client asks for base64 by default and decodes it.
        batch = await client.embeddings.create(model="simulated-model", input=["alpha", "beta"])
        again = await client.embeddings.create(
            model="simulated-model", input="alpha", encoding_format="float"
        )
    assert [d.index for d in batch.data] == [0, 1]
    alpha, beta = (d.embedding for d in batch.data)
    assert len(alpha) == 16
    assert math.isclose(math.sqrt(sum(x * x for x in alpha)), 1.0, rel_tol=1e-5)
    assert alpha != beta
    assert all(math.isclose(a, b, rel_tol=1e-5) for a, b in zip(alpha, again.data[0].embedding, strict=True))
    assert batch.usage.prompt_tokens == 2
    assert batch.usage.total_tokens == 2


async def test_embedding_dimensions_field_sets_the_vector_length(start_simulator):
    sim = await start_simulator()
    async with openai_client(sim) as client:
        reply = await client.embeddings.create(model="simulated-model", input="x", dimensions=8)
    assert len(reply.data[0].embedding) == 8


async def test_embeddings_for_an_unknown_model_are_404(start_simulator, http):
    sim = await start_simulator()
    async with http.post(sim.url + "/v1/embeddings", json={"model": "nope", "input": "x"}) as resp:
        assert resp.status == 404
