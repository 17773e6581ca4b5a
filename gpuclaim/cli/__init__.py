"""The command-line face: parse, call one core function, render. No domain logic here."""
