"""The prompt registry and its experiments (reference §10.4).

=============  ==================================================================
``tables``     versions, routings, feedback (``ai_prompt_*``, ``ai_result_feedback``)
``registry``   uploads (checked in the sandbox), versions, routings as stored
``routing``    a routing's rules and the sticky choice of a user's variant (no SQL)
``stats``      per-version stats from the invocation logs and the job events
``guard``      the loop that rolls a bad variant back to the control
``feedback``   learners' ratings of their items
``service``    :class:`~job_service.prompts.service.Prompts`: all of it, by name
=============  ==================================================================

The templates themselves compile and render in the shared sandbox
(:mod:`airuntime_common.prompts`), here to validate an upload, in the worker to
render an attempt.
"""

from job_service.prompts.service import PromptOverview, Prompts

__all__ = ["PromptOverview", "Prompts"]
