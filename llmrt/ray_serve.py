"""Replicas of `llmrt serve` on Ray Serve, with conversation affinity.

    pip install "llmrt[ray]"
    llmrt serve MODEL --ray --replicas 2 --port 8000       # a local Ray instance, loopback
    curl localhost:8000/v1/chat/completions -H 'serve_multiplexed_model_id: conv-42' -d '{...}'

Each replica is the whole server of llmrt/server.py (engine, slots with their streaming caches,
the same OpenAI routes and the chat page) in a Ray Serve deployment behind Ray Serve's HTTP
proxy; Ray's controller restarts a replica that dies while the others keep answering.

Affinity: a conversation's requests must reach the replica that holds its cache, or the prefix
cache is lost. Ray Serve's proxy puts the `serve_multiplexed_model_id` header of a request into
its routing metadata; ConversationRouter (a Ray Serve request router) sends every request with
the same value to the same replica, chosen by rendezvous hashing over the live replicas: every
proxy (one per node) picks the same one without sharing state, and a replica's death moves only
its own conversations (when the chosen replica is at max_ongoing_requests, another one answers:
availability first). Inside the replica the
same header (or the body's `user`, or `X-Session-Id`) picks the slot. Responses carry
`X-LLMRT-Replica` (the replica's id and pid) so clients and tests can see where they landed.

On a real cluster: start Ray on every machine (`ray start --head` on one, `ray start --address
HEAD:6379` on the others), then run `llmrt serve MODEL --ray --ray-address auto --replicas N
--host 0.0.0.0`: the replicas spread over the nodes (each reserves --threads CPUs), the model
file must be at the same path on every node (or use a known name, fetched per node), and a
load balancer in front of the proxies (one per node) should hash the same header.
"""
import hashlib
import logging
import os
import time
from typing import List, Optional

from ray import serve
from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

log = logging.getLogger("llmrt")

AFFINITY_HEADER = "serve_multiplexed_model_id"


class ConversationRouter(RequestRouter):
    """Routes all requests of one conversation (the multiplexed model id Ray's proxy reads from
    the `serve_multiplexed_model_id` header) to one replica: the live replica with the highest
    hash of (conversation, replica id) (rendezvous hashing). Every proxy's router computes the
    same choice without sharing state, and when a replica dies only its conversations move; the
    other replicas follow as a fallback rank (when the chosen one is at max_ongoing_requests)."""

    async def choose_replicas(self, candidate_replicas: List[RunningReplica],
                              pending_request: Optional[PendingRequest] = None) -> List[List[RunningReplica]]:
        conv = pending_request.metadata.multiplexed_model_id if pending_request is not None else ""
        if not conv or not candidate_replicas:
            return [candidate_replicas]
        first = max(candidate_replicas, key=lambda r: home_score(conv, r.replica_id.unique_id))
        return [[first], [r for r in candidate_replicas if r is not first]]


def home_score(conversation: str, replica_id: str) -> bytes:
    """The rendezvous-hash weight of a replica for a conversation (highest wins)."""
    return hashlib.blake2b(f"{conversation}\0{replica_id}".encode(), digest_size=8).digest()


@serve.ingress()
class LlmrtReplica:
    """One replica: a model, an engine and llmrt.server's app (Ray Serve asks for it after the
    constructor: __serve_build_asgi_app__)."""

    def __init__(self, model_path: str, options: dict):
        from llmrt.chat import ChatTemplate
        from llmrt.engine import Engine
        from llmrt.model import Model
        from llmrt.server import create_app

        o = dict(options)
        model = Model(model_path, **({"n_threads": o["threads"]} if o.get("threads") else {}),
                      **({"ctx_size": o["ctx_size"]} if o.get("ctx_size") else {}))
        keep = o.get("n_keep", "auto")
        self.engine = Engine(model, n_parallel=o.get("parallel", 4), ctx_size=o.get("ctx_size"),
                             n_keep=4 if keep == "auto" else int(keep), n_discard=o.get("n_discard", -1),
                             n_batch=o.get("n_batch", 256), max_queue=o.get("max_queue", 64),
                             queue_timeout=o.get("timeout", 600.0), n_predict=o.get("n_predict", -1),
                             prefill_chunk=o.get("prefill_chunk"))
        template = (ChatTemplate.for_model(model, o.get("chat_template"))
                    if model.tokenizer is not None else None)
        app = create_app(self.engine, o.get("alias") or os.path.basename(model_path), template, n_keep=keep,
                         api_keys=o.get("api_keys"), cors_origins=o.get("cors_origins"),
                         **({"body_timeout": o["body_timeout"]} if o.get("body_timeout") else {}))
        ctx = serve.get_replica_context()
        self.replica = f"{ctx.replica_id.unique_id}:{os.getpid()}"

        @app.middleware("http")
        async def _name(request, call_next):
            response = await call_next(request)
            response.headers["X-LLMRT-Replica"] = self.replica
            return response
        self._llmrt_app = app      # (the wrapper owns an `app` property)
        log.info("llmrt: ray replica %s ready", self.replica)

    def __serve_build_asgi_app__(self):
        return self._llmrt_app

    def check_health(self):
        if not self.engine._thread.is_alive():
            raise RuntimeError("the engine thread stopped")

    def __del__(self):
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close(timeout=2)


def build_app(model_path: str, replicas: int, options: dict):
    """The Ray Serve application: `replicas` LlmrtReplica's routed by ConversationRouter."""
    from ray.serve.config import RequestRouterConfig
    threads = int(options.get("threads") or 1)
    dep = serve.deployment(
        LlmrtReplica, name="llmrt", num_replicas=int(replicas),
        ray_actor_options={"num_cpus": threads},
        max_ongoing_requests=int(options.get("parallel", 4)) + int(options.get("max_queue", 64)),
        health_check_period_s=2, health_check_timeout_s=30,
        request_router_config=RequestRouterConfig(
            request_router_class="llmrt.ray_serve:ConversationRouter"))
    return dep.bind(model_path, options)


def run(model_path: str, *, host: str = "127.0.0.1", port: int = 8000, replicas: int = 2,
        address: Optional[str] = None, options: Optional[dict] = None):
    """Start (or join, with address) a Ray instance, run the application, serve until Ctrl-C."""
    import ray
    options = dict(options or {})
    threads = int(options.get("threads") or 1)
    options["threads"] = threads
    if address:
        ray.init(address=address)
    else:                                # a local instance: enough CPUs for the replicas
        ray.init(num_cpus=max(os.cpu_count() or 1, replicas * threads), include_dashboard=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(os.path.abspath(model_path), replicas, options), name="llmrt", route_prefix="/")
    log.info("llmrt: %d replicas on Ray Serve at http://%s:%d (affinity header: %s)", replicas, host,
             port, AFFINITY_HEADER)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        serve.shutdown()
        ray.shutdown()
