"""benchmarks.quality.bigram: the word-bigram yardstick beside the detector's figures."""

from benchmarks.quality.bigram import BigramReference, words_of


def test_bigram_reference_flags_the_word_that_breaks_its_neighbours(small_tokenizer):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(small_tokenizer))
    corpus = ["the cat sat on the mat.\nthe dog sat on the rug."] * 50
    reference = BigramReference(corpus, tok)
    text = "The cat sat under the mat."
    words = words_of(tok, text)
    assert words == ["the", "cat", "sat", "under", "the", "mat", "."]
    suspicion = reference.suspicion(words)
    assert suspicion.argmax() == words.index("under")
    # A sentence seen in training has no word that breaks its neighbours.
    assert reference.suspicion(["the", "cat", "sat", "on", "the", "mat", "."]).max() < 0
