"""deepinfer.pd: prefill/decode disaggregation across worker processes.

A prefill worker and a decode worker (each a separate process with its own model and KV pool)
split every request: the prefill worker computes the prompt's KV and first token, the pages move
through shared memory, and the decode worker generates the rest. Routing goes through
``deepinfer_sched`` policies.

Example::

    from deepinfer import LLM, SamplingParams
    from deepinfer.pd import PDConfig

    with LLM(pd=PDConfig(num_prefill_workers=1, num_decode_workers=1)) as llm:
        print(llm.generate("Hello", SamplingParams(temperature=0, max_tokens=8))[0].text)
"""

from deepinfer.pd.config import PD_POLICIES, PDConfig
from deepinfer.pd.coordinator import PDCoordinator, PDWorkerError

__all__ = ["PD_POLICIES", "PDConfig", "PDCoordinator", "PDWorkerError"]
