"""Label errors: out-of-fold probabilities ranked by one score, or per-example gradient norms.

A model trained on every row memorises its mislabeled rows, so its own confidence (or
gradient norm) on them says little. [`find_label_errors`][jaxwise.label_errors.find_label_errors]
(method ``"oof"``, the default) trains every fold model at once — ``vmap`` over models in
one compiled program, through `jaxwise.train`'s update path — so every row's probabilities
come from models that never saw it; each fold standardises its inputs with its own training
rows and stops early on an inner validation split of them (one training row in 6, not
trained on), so neither the features nor the labels of the rows it judges influence it.
The rows are then ranked by ONE label-quality score
([`label_quality`][jaxwise.label_errors.label_quality]: self-confidence ``p(given)`` by
default), and confident learning (Northcutt et al., 2021) estimates how many labels are wrong
(``LabelIssues.num_issues``: a suggested cut-off, not a reordering).
Method ``"gradnorm"`` ranks the rows of a model trained on all of them by per-example
gradient norm; [`hardest_examples`][jaxwise.label_errors.hardest_examples] does the same for
any loss. The options come in four small objects: the model
([`MLP`][jaxwise.label_errors.MLP] or any [`Classifier`][jaxwise.label_errors.Classifier]),
the cross-validation ([`Folds`][jaxwise.label_errors.Folds]), the training of each fold model
([`Training`][jaxwise.label_errors.Training]) and the score
([`Scoring`][jaxwise.label_errors.Scoring]).

Examples:
    Fifteen flipped labels among 300 rows, found out of fold:

    >>> import numpy as np
    >>> from jaxwise.data import make_blobs, flip_labels
    >>> x, y = make_blobs(300, n_classes=3, seed=0)
    >>> noisy, flipped = flip_labels(y, 15, 3, seed=1)
    >>> found = find_label_errors(x, noisy, seed=0)
    >>> float(np.isin(found.top(15), flipped).mean()) >= 0.8
    True

References:
  Northcutt, Jiang & Chuang, Confident Learning: Estimating Uncertainty in Dataset Labels,
  JAIR 2021, https://arxiv.org/abs/1911.00068
"""

from jaxwise.label_errors._confident import LabelIssues as LabelIssues
from jaxwise.label_errors._confident import confident_learning as confident_learning
from jaxwise.label_errors._confident import label_quality as label_quality
from jaxwise.label_errors._confident import precision_recall as precision_recall
from jaxwise.label_errors._find import find_label_errors as find_label_errors
from jaxwise.label_errors._gradnorm import hardest_examples as hardest_examples
from jaxwise.label_errors._oof import OutOfFold as OutOfFold
from jaxwise.label_errors._oof import out_of_fold_probabilities as out_of_fold_probabilities
from jaxwise.label_errors._oof import stratified_folds as stratified_folds
from jaxwise.label_errors._options import MLP as MLP
from jaxwise.label_errors._options import Classifier as Classifier
from jaxwise.label_errors._options import Folds as Folds
from jaxwise.label_errors._options import Scoring as Scoring
from jaxwise.label_errors._options import Training as Training

__all__ = [
    "MLP",
    "Classifier",
    "Folds",
    "LabelIssues",
    "OutOfFold",
    "Scoring",
    "Training",
    "confident_learning",
    "find_label_errors",
    "hardest_examples",
    "label_quality",
    "out_of_fold_probabilities",
    "precision_recall",
    "stratified_folds",
]
