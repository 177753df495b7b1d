"""msched: a reference multi-stream scheduler for torch.fx graphs.

The graph exit depends on the last write of every in-place target, so a capture into a graph
input is emitted before ``output`` and joined on the caller's stream.  See docs/design.md.
"""

from __future__ import annotations

from msched import ops
from msched._torch_internals import warn_if_untested
from msched._version import __version__
from msched.analysis._targets import register_mutation, register_pure, register_side_effect
from msched.analysis.collectives import register_collective
from msched.analysis.cost import CostModel, DefaultCostModel, RooflineCostModel
from msched.analysis.cost_table import TableCostModel
from msched.analysis.dag import Dag, build_dag
from msched.analysis.measured import MeasuredCostModel, measure_costs
from msched.compile.compiler import (
    CompiledGraph,
    MschedBackend,
    Piece,
    backend,
    compile_pieces,
)
from msched.compile.tracing import cuda_streams_on_cpu, trace_streams
from msched.errors import (
    CollectiveOutsideGraphWarning,
    InductorInterfaceError,
    InvalidArgumentError,
    InvalidGraphError,
    MissingDependencyError,
    MschedError,
    NoGraphCompiledError,
    PieceVerificationError,
    RankFailedError,
    RanksTimeoutError,
    ReinplaceError,
    ScheduleVerificationError,
    SplitOpNotFoundError,
    SplitOpNotFoundWarning,
    TorchInternalsError,
    TrainingGraphError,
    UnreadStreamOpsError,
    UntestedVersionWarning,
    UsageError,
)
from msched.limits import MAX_STREAMS
from msched.models.decoders import DecoderStack
from msched.proof.dialects import Dialect
from msched.proof.executor import Execution, execute
from msched.proof.memory import MemoryReport, peak_memory
from msched.proof.timeline import Timeline, simulate
from msched.proof.verifier import Report, Violation, verify
from msched.scheduling.exact import OptimalMakespan, optimal_makespan
from msched.scheduling.pipeline import Schedule, read_schedule, schedule

# A torch outside the tested range warns once, naming both (msched._torch_internals).
warn_if_untested()

__all__ = [
    "MAX_STREAMS",
    "CollectiveOutsideGraphWarning",
    "CompiledGraph",
    "CostModel",
    "Dag",
    "DecoderStack",
    "DefaultCostModel",
    "Dialect",
    "Execution",
    "InductorInterfaceError",
    "InvalidArgumentError",
    "InvalidGraphError",
    "MeasuredCostModel",
    "MemoryReport",
    "MissingDependencyError",
    "MschedBackend",
    "MschedError",
    "NoGraphCompiledError",
    "OptimalMakespan",
    "Piece",
    "PieceVerificationError",
    "RankFailedError",
    "RanksTimeoutError",
    "ReinplaceError",
    "Report",
    "RooflineCostModel",
    "Schedule",
    "ScheduleVerificationError",
    "SplitOpNotFoundError",
    "SplitOpNotFoundWarning",
    "TableCostModel",
    "Timeline",
    "TorchInternalsError",
    "TrainingGraphError",
    "UnreadStreamOpsError",
    "UntestedVersionWarning",
    "UsageError",
    "Violation",
    "__version__",
    "backend",
    "build_dag",
    "compile_pieces",
    "cuda_streams_on_cpu",
    "execute",
    "measure_costs",
    "ops",
    "optimal_makespan",
    "peak_memory",
    "read_schedule",
    "register_collective",
    "register_mutation",
    "register_pure",
    "register_side_effect",
    "schedule",
    "simulate",
    "trace_streams",
    "verify",
]
