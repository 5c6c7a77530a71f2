"""`asyncrl serve`: an OpenAI-compatible HTTP server over the generation engine, with what RL needs (token ids in
and out, per-token log-probs and policy versions, weight reloads from an HF folder, pause, resume, abort).

    protocol.py      the request and response bodies (pydantic), OpenAI-style errors
    served_model.py  ServedModel: the engine, tokenizer and admin verbs; completion hooks (a recording endpoint)
    choices.py       a request's n choices on the engine's batch, stop strings
    completions.py   POST /v1/completions
    chat.py          POST /v1/chat/completions: chat template, tools, tool-call parsing
    metrics.py       the Prometheus metrics of GET /metrics
    app.py           build_app(served, settings): the routes, the API key, errors
    options.py       the command's flags (light: the top-level CLI imports it)
    cli.py           serve(options): uvicorn on 127.0.0.1 unless told otherwise
    recording.py     RecordingEndpoint: the app on 127.0.0.1, one session per agent run, each completion recorded
    rollout_served.py RolloutServedModel: a training run's rollout backend as the served model; session defaults
    agent_runner.py  your `async def rollout(client, sample)`: loaded, run under a session, counted (rollout.agent)

This package's __init__ imports nothing: fastapi and uvicorn come with the `serve` extra (and openai with
`agents`), and `asyncrl --help` must not need them.
"""
