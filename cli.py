"""The command-line conventions every script shares: `--help` shows a short description (the docstring's first
paragraph and its usage lines; the rest of the docstring is for readers of the code) and every flag with its
default."""
import argparse
import itertools


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The description as written (usage lines keep their layout), and each flag's default after its help text."""


def short(doc):
    """A module docstring's first paragraph and the indented (usage) paragraphs right after it."""
    paras = doc.strip("\n").split("\n\n")
    return "\n\n".join([paras[0], *itertools.takewhile(lambda p: p.startswith("    "), paras[1:])])


def parser(doc, **kwargs):
    """The ArgumentParser of a script whose module docstring is `doc`."""
    return argparse.ArgumentParser(description=short(doc), formatter_class=HelpFormatter, **kwargs)
