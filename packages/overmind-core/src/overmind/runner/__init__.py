"""``overmind run``: a fresh Python process with torch and the model libraries already imported.

A per-user *template* process (one per interpreter, installed packages, preload list and import-time
environment) imports the heavy libraries once and calls ``overmind.activate()``; each ``overmind run``
asks it to fork, and the child becomes the caller's process (descriptors, cwd, environment, limits,
signals, argv) before it runs the caller's program. ``run`` and a template talk in the frames of
:mod:`overmind.ipc.protocol`. See docs/run.md.

One job per module:

* :mod:`.client`: the ``run`` command (request, signal relay, exit status, the plain-python fallback).
* :mod:`.template`: the template process (preload, the fork loop, the thread check).
* :mod:`.child`: what the forked child does to become the caller's process and run the program.
* :mod:`.envkey`: which template may serve which program (the key, the environment its imports read).
* :mod:`.preload`: the preload list (default, ``pyproject.toml``, ``OVERMIND_PRELOAD``).
* :mod:`.registry`: the templates' files in the runtime directory; finding, starting, stopping them.
* :mod:`.threads`: OpenBLAS's threads (none in the template, the usual count in each child).
* :mod:`.sources`: whether the code the template imported is still the code on disk (inotify).
* :mod:`.commands`: what the ``overmind`` command (:mod:`overmind.cli.main`) adds for templates.
"""
