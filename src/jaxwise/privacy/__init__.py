"""DP-SGD with an honest (ε, δ) from Google's ``dp-accounting``.

DP-SGD (Abadi et al., 2016) clips every example's gradient to norm ``C``,
sums, adds Gaussian noise ``N(0, σ²C²)`` once per (logical) batch and
divides by the batch size. The privacy guarantee comes from an accountant;
we never hand-roll one: `epsilon` composes dp-accounting's
``PoissonSampledDpEvent(q, GaussianDpEvent(σ))`` over the steps with its RDP
(default) or PLD accountant.

**What the guarantee covers.** The accountant analyses *Poisson sampling*:
each example joins each batch independently with probability ``q``.
`poisson_batch` implements exactly that, inside ``jit``, padded to a
fixed maximum size with a mask (one compiled shape). Fixed-size batches from
a shuffle (`shuffled_batches`) are what most code uses, but the
Poisson analysis does not formally cover them; use them knowingly.

**Normalisation.** We divide the noisy sum by the *expected* batch size
``q·N`` under Poisson sampling — a data-independent constant, so the result
is post-processing of the privatised sum. Dividing by the *actual* size
would reveal how many examples were sampled (whether a given person is in
the batch), which the analysis does not account for. With fixed-size
batches the two are the same. Gradient accumulation over micro-batches adds
the clipped sums first and the noise **once** per logical batch
(`dp_gradient_accumulated`), never per micro-batch.

References:
  Abadi et al., Deep Learning with Differential Privacy, CCS 2016,
  https://arxiv.org/abs/1607.00133

Examples:
    The ε of MNIST-sized training (60,000 examples, batches of 256, 60 epochs):

    >>> round(epsilon(noise_multiplier=1.1, sample_rate=256 / 60000, steps=14062, delta=1e-5), 2)
    2.6
"""

from jaxwise.privacy._accounting._accountant import PrivacyPlan as PrivacyPlan
from jaxwise.privacy._accounting._accountant import epoch_epsilon as epoch_epsilon
from jaxwise.privacy._accounting._accountant import epsilon as epsilon
from jaxwise.privacy._accounting._accountant import noise_multiplier_for as noise_multiplier_for
from jaxwise.privacy._accounting._accountant import plan_epsilon as plan_epsilon
from jaxwise.privacy._accounting._accountant import privacy_plan as privacy_plan
from jaxwise.privacy._accounting._choose import MechanismCandidate as MechanismCandidate
from jaxwise.privacy._accounting._choose import MechanismChoice as MechanismChoice
from jaxwise.privacy._accounting._choose import choose_mechanism as choose_mechanism
from jaxwise.privacy._audit import Canaries as Canaries
from jaxwise.privacy._audit import audit_canaries as audit_canaries
from jaxwise.privacy._audit import empirical_epsilon as empirical_epsilon
from jaxwise.privacy._clipping._adaptive import AdaptiveClip as AdaptiveClip
from jaxwise.privacy._clipping._dpgradient import DPGradientFn as DPGradientFn
from jaxwise.privacy._clipping._dpgradient import dp_gradient as dp_gradient
from jaxwise.privacy._clipping._dpgradient import dp_gradient_fn as dp_gradient_fn
from jaxwise.privacy._clipping._unit import UnitClipped as UnitClipped
from jaxwise.privacy._clipping._unit import unit_clip as unit_clip
from jaxwise.privacy._epoch import make_dp_train_epoch as make_dp_train_epoch
from jaxwise.privacy._mechanisms._bandmf import BandMF as BandMF
from jaxwise.privacy._mechanisms._bandmf import BandMFStrategy as BandMFStrategy
from jaxwise.privacy._mechanisms._bandmf import bandmf_strategy as bandmf_strategy
from jaxwise.privacy._mechanisms._blt import BLT as BLT
from jaxwise.privacy._mechanisms._blt import BLTStrategy as BLTStrategy
from jaxwise.privacy._mechanisms._blt import blt_strategy as blt_strategy
from jaxwise.privacy._mechanisms._noise import DPGradient as DPGradient
from jaxwise.privacy._mechanisms._noise import add_dp_noise as add_dp_noise
from jaxwise.privacy._mechanisms._noise import dp_gradient_accumulated as dp_gradient_accumulated
from jaxwise.privacy._mechanisms._privatizer import PrivatizerState as PrivatizerState
from jaxwise.privacy._mechanisms._privatizer import privatizer as privatizer
from jaxwise.privacy._mechanisms._protocols import ClipPolicy as ClipPolicy
from jaxwise.privacy._mechanisms._protocols import DPAccounting as DPAccounting
from jaxwise.privacy._mechanisms._protocols import NoiseMechanism as NoiseMechanism
from jaxwise.privacy._mechanisms._protocols import PairingError as PairingError
from jaxwise.privacy._sampling import poisson_batch as poisson_batch
from jaxwise.privacy._sampling import shuffled_batches as shuffled_batches
from jaxwise.train import CyclicPoissonSampler as CyclicPoissonSampler
from jaxwise.train import PoissonSampler as PoissonSampler

__all__ = [
    "AdaptiveClip",
    "BLT",
    "BLTStrategy",
    "BandMF",
    "BandMFStrategy",
    "Canaries",
    "CyclicPoissonSampler",
    "MechanismCandidate",
    "MechanismChoice",
    "ClipPolicy",
    "DPAccounting",
    "DPGradient",
    "DPGradientFn",
    "NoiseMechanism",
    "PairingError",
    "PoissonSampler",
    "PrivacyPlan",
    "PrivatizerState",
    "UnitClipped",
    "add_dp_noise",
    "audit_canaries",
    "bandmf_strategy",
    "blt_strategy",
    "choose_mechanism",
    "dp_gradient",
    "dp_gradient_accumulated",
    "dp_gradient_fn",
    "empirical_epsilon",
    "epoch_epsilon",
    "epsilon",
    "make_dp_train_epoch",
    "noise_multiplier_for",
    "plan_epsilon",
    "poisson_batch",
    "privacy_plan",
    "privatizer",
    "shuffled_batches",
    "unit_clip",
]
