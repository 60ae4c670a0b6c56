"""Offline text shared by training, analysis and evaluation: nothing is ever downloaded.

=============  =========================================================================================
wordlists      English word lists shipped by ``wonderwords``
corpus         the built-in training corpus (prose plus retrieval documents) and its sentence writer
haystack       long inputs of a given token length from the corpus or the user's files
needles        the needles of the retrieval score and needle-in-a-haystack prompts
tasks          synthetic retrieval tasks (copy, recall, needle, prose) with the spans their loss counts
heldout        the held-out evaluation set: fixed rows, split into local and retrieval targets
jsonl          reading JSON-lines files with errors that name the file and line
files          reading a user's text file with errors that name it
probes         task probes: held-out retrieval accuracy of our models at chosen distances
prompt_format  how a task's text is put to a model (plain, chat template, a wrapper): the one rule
toy_tokenizer  the toy models' byte-level BPE of 4,096 ids, built offline from our own text
=============  =========================================================================================
"""
