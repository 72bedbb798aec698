"""What a kind of draft answers, for decoding and for training: `Kind`, the base every kind's class extends.

A kind lives in one folder (kinds/<name>/): its `__init__.py` holds its `Kind` subclass, which knows everything
that differs between kinds and imports its heavy modules (torch, its model, drafter, trainer, checks) only inside
its methods, so the registry (kinds/__init__.py) is cheap to import. The top floor (specdistill/) chooses a kind
and hands it down; each floor below asks it only what its own protocol says, and `Kind` implements them all:

    registry     recognises / holds          is a --draft value / an object in memory of this kind?
                 fit_problem / load          why it cannot run next to a target (configs only); the draft in memory
    decoding     drafter / reserve           the Drafter our decoder runs, its static caches      (DraftingKind,
                 assisted_generate           transformers' assisted generation through it          decode.loop.drafters)
    serving      vllm_method / vllm_options  vLLM's speculative method and keys       (ServingKind, decode.serving)
    deployment   deploy_check / serving_commands     checks, copy-paste commands  (DeployingKind, decode.deploy)
    recipes      model_options / distill_options     the recipe keys only this kind takes (pydantic)
                 defaults                    recipe keys that work for this kind, used where the recipe is silent
                 check_model / check_recipe  what it cannot combine with           (RecipeKind, distill.recipe)
    training     check_plan / build / prepare / trainer      from configs, the trainable module, after the rows,
                 unwrap / from_checkpoint / check_resume     the Trainer's class; the served draft of a trained
                                                             module and of a checkpoint folder
                                                                                   (TrainingKind, distill.models)
    publishing   save / card                 its served folder; the model card's text
                                                                                   (PublishingKind, distill.publish)

Defaults here are those of a kind that does not train and needs nothing special; a kind overrides what differs.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from distill.publish.card_text import CardText

if TYPE_CHECKING:
    import torch

    from decode.deploy.deploy_check import DeployReport
    from decode.loop.drafters import Drafter


class Kind:
    """One kind of draft. Subclasses set the class attributes and override the methods that differ."""

    name: str = ""                     # the one vocabulary: recipes' model.draft_kind, the eval JSON, the export
    aliases: tuple[str, ...] = ()      # older names still read (kind_named)
    title: str = ""                    # what it is, plural, in messages ("EAGLE-3 heads")
    summary: str = ""                  # one line for model.draft_kind's description in the recipe reference
    vllm_method: str = ""              # vLLM's speculative_config method
    has_weights: bool = True           # a model folder or hub id (weights, config, tokenizer): checked before loading
    model_free_drafts: bool = False    # drafting runs no model: vLLM's levels get the batch cost model (batch_cost.py)
    assisted_refusal: str | None = None  # why transformers' assisted generation cannot run it; None when it can
    trains: bool = False               # specdistill-train can train it (model.draft_kind)
    language_model: bool = False       # a causal LM of its own (reads no target state): teacher-forcing applies
    defaults: dict[str, Any] = {}      # "section.key" -> value, where a recipe of this kind leaves the key unset
    model_options: type | None = None  # a pydantic Section mixed into the recipe's model section: its own keys
    distill_options: type | None = None  # likewise for the distill section

    # -- decoding ---------------------------------------------------------------------------------------------------
    def recognises(self, draft: str) -> bool:
        """Whether a --draft value (a folder, a hub id, a name) is a draft of this kind."""
        return False

    def holds(self, draft: object) -> bool:
        """Whether a draft in memory (a model, a drafter) is of this kind."""
        return False

    def fit_problem(self, draft: str, target: str, trust_remote_code: bool = False) -> str | None:
        """Why ``draft`` cannot run next to ``target``, found from configs before any weight loads; None if it can."""
        return None

    def load(self, draft: str, target: torch.nn.Module, device: torch.device, dtype: torch.dtype | str,
             trust_remote_code: bool = False, earliest: bool = False) -> object:
        """The draft named by ``draft`` in memory, next to the loaded ``target`` (``earliest``: prompt lookup's
        earliest-occurrence rule, as vLLM's ngram)."""
        raise NotImplementedError(self.name)

    def drafter(self, draft: object, target: torch.nn.Module, compile: bool = False, capacity: int = 0,
                max_gamma: int = 8) -> Drafter:
        """The drafter speculative decoding runs for ``draft`` (decode.loop.drafters.Drafter)."""
        raise NotImplementedError(self.name)

    def reserve(self, draft: object, target: torch.nn.Module, capacity: int, max_gamma: int) -> None:
        """Size (and compile) the static caches of the compiled path for ``capacity`` positions."""
        return None

    def assisted_generate(self, target: torch.nn.Module, draft: object, prompt: torch.Tensor, gamma: int,
                          **generate_kwargs) -> torch.Tensor:
        """transformers' assisted generation of ``target`` with this draft drafting ``gamma`` tokens per step."""
        raise ValueError(self.assisted_refusal or f"{self.name}: no assisted generation")

    def vllm_options(self) -> dict:
        """Keys of vLLM's speculative_config this kind adds to the method and gamma (e.g. prompt lookup's n-gram
        sizes)."""
        return {}

    def save(self, draft: object, folder: str | Path, gamma: int) -> None:
        """The served folder of ``draft`` (weights, config, a generation config drafting ``gamma`` tokens)."""
        raise ValueError(f"{self.name} has no weights: there is no folder to export")

    def speculators_fields(self, config: dict) -> dict | None:
        """The speculators-format keys of this kind's exported config.json (``config``, decode.deploy.speculators),
        its `speculators_model_type` among them; None where vLLM reads no such format for the kind (vLLM 0.32 reads
        eagle3, peagle, dflash and dflash2: a standalone or PARD draft is served with --speculative-config)."""
        return None

    # -- deployment -------------------------------------------------------------------------------------------------
    def deploy_check(self, target: str, draft: str | Path, trust_remote_code: bool = False) -> DeployReport:
        """The deployment checks of a served folder of this kind next to ``target`` (decode.deploy.deploy_check)."""
        raise ValueError(f"{self.name} has no folder to check")

    def serving_commands(self, report: DeployReport) -> str:
        """Copy-paste commands that serve the checked pair (decode.deploy.serving_commands writes each line)."""
        raise ValueError(f"{self.name} has no folder to serve")

    @property
    def card(self) -> CardText:
        """The model card's text for this kind."""
        raise ValueError(f"{self.name} has no folder to describe")

    # -- recipes ----------------------------------------------------------------------------------------------------
    def check_model(self, model: Any) -> None:
        """The model section's rules for this kind (schema.require); the other kinds' keys must stay unset."""
        return None

    def check_recipe(self, recipe: Any) -> None:
        """Rules between sections for this kind: what it cannot combine with (schema.require)."""
        return None

    # -- training ---------------------------------------------------------------------------------------------------
    def check_plan(self, cfg: Any, target_config: Any, tokenizer: Any, hidden_state_cache: bool) -> None:
        """Everything checkable from configs before weights load (distill.models.load.check_model_plan)."""
        return None

    def check_resume(self, recipe: Any, resume: str) -> None:
        """The checkpoint to resume from holds a draft of the recipe's shape."""
        return None

    def build(self, cfg: Any, target: torch.nn.Module, dtype: torch.dtype, lora: Any) -> torch.nn.Module:
        """The trainable draft (distill.models.load.load_draft)."""
        raise ValueError(f"model.draft_kind: {self.name} drafts are not trained")

    def prepare(self, recipe: Any, draft: torch.nn.Module, target: torch.nn.Module, rows: Any) -> None:
        """After the training rows are known (e.g. a head's draft vocabulary counted on them)."""
        return None

    def trainer(self) -> type:
        """The Trainer class of this kind (distill.run.trainer.DistillTrainer or a subclass)."""
        raise ValueError(f"model.draft_kind: {self.name} drafts are not trained")

    def unwrap(self, model: object) -> object | None:
        """The served draft inside a training wrapper of this kind (what Trainer holds); None if ``model`` is no such
        wrapper."""
        return None

    def from_checkpoint(self, folder: Path, final: torch.nn.Module) -> torch.nn.Module | None:
        """The served draft saved in a Trainer checkpoint folder when this kind stores it its own way; None: the
        standard model folder (distill.publish.export.draft_at_checkpoint)."""
        return None
