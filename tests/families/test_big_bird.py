

def test_chunked_gather_equals_one_chunk(monkeypatch):
    """The sparse kernel gathers CHUNK_TOKENS queries' key blocks at a time; the chunks change no number."""
    import bertblocks.plugins.block_sparse as block_sparse

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 80, 8, generator=g, dtype=torch.float64) for _ in range(3))
    key_mask = torch.zeros(2, 80, dtype=torch.float64)
    key_mask[1, 70:] = torch.finfo(torch.float64).min
    blocks, valid = key_blocks(20, random_blocks(80, 4, 4, 2, training=True, seed=1, max_positions=4096))
    whole = block_sparse_attention(q, k, v, key_mask, blocks, valid, 4, 8**-0.5)
    monkeypatch.setattr(block_sparse, "CHUNK_TOKENS", 12)  # 3 query blocks a chunk: 6 chunks, the last short
    assert torch.equal(block_sparse_attention(q, k, v, key_mask, blocks, valid, 4, 8**-0.5), whole)
