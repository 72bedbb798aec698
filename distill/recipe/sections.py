"""Typed recipes: one pydantic model per concern (model, lora, data, distill, train, eval, hub) under `Recipe`.

A recipe YAML file holds the fields of these models; defaults and ranges live in their `Field`s and nowhere else,
rules between keys in their validators (distill/recipe/schema.py turns every problem into one RecipeError naming
the key, the bad value and what is allowed). The `train:` section is transformers.TrainingArguments' own fields
(distill/recipe/train_config.py), `data:` is in distill/recipe/data_config.py. Reading a file, applying
`section.key=value` overrides and writing the key reference live in distill/recipe/loader.py (`load_recipe`).

The classes here hold the keys every kind of draft shares. Each kind brings its own keys (its `model_options` and
`distill_options`); `recipe_schema(kinds, default)` mixes them into the model and distill sections of one `Recipe`
class for the kinds handed in (the top floor hands in the registry: specdistill.recipes). A recipe then holds its
kind as a value, `recipe.model.kind`, which the rest of distill/ asks (the kind is never looked up by name here).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal, Protocol

from annotated_types import Ge, Gt, MinLen
from pydantic import Field, JsonValue, PrivateAttr, field_validator, model_validator

from decode.loop.auto_gamma import fixed_gammas
from distill.losses.divergences import LOSSES
from distill.losses.loss_mix import LossMix, LossSpecError, teacher_divergences
from distill.recipe.data_config import DataConfig
from distill.recipe.schema import OVERRIDE_SOURCE, RecipeError, Section, require, rule_error
from distill.recipe.train_config import TrainConfig, check_precision

SECTIONS = ("model", "lora", "data", "distill", "train", "eval", "hub")

__all__ = ["OVERRIDE_SOURCE", "RecipeError", "Recipe", "SECTIONS", "ModelKeys", "LoraConfig", "DataConfig",
           "DistillKeys", "TrainConfig", "EvalConfig", "HubConfig", "RecipeKind", "check_precision", "recipe_schema"]


class RecipeKind(Protocol):
    """What a recipe asks of its kind of draft (kinds.base.Kind implements it)."""

    name: str                          # model.draft_kind's value
    aliases: tuple[str, ...]           # former names, still read
    title: str                         # plural, in messages ("EAGLE-3 heads")
    summary: str                       # one line of model.draft_kind's description
    trains: bool                       # model.draft_kind may name it
    defaults: dict[str, Any]           # "section.key" -> value where the recipe is silent
    model_options: type | None         # a Section of its own model keys
    distill_options: type | None       # a Section of its own distill keys

    def check_model(self, model: Any) -> None: ...

    def check_recipe(self, recipe: Any) -> None: ...


def mixins(options: list[type | None]) -> tuple[type, ...]:
    """The distinct option classes, without one that another of them extends (one base class at most once)."""
    present = [o for i, o in enumerate(options) if o is not None and o not in options[:i]]
    return tuple(o for o in present if not any(other is not o and issubclass(other, o) for other in present))


def kind_called(kinds: Sequence[RecipeKind], name: str) -> RecipeKind:
    """The kind of ``kinds`` called ``name`` (or one of its former names)."""
    for kind in kinds:
        if name == kind.name or name in kind.aliases:
            return kind
    raise ValueError(f"unknown draft kind {name!r}; the kinds are {', '.join(kind.name for kind in kinds)}")


def other_kinds_keys_unset(section: Section, kinds: Sequence[RecipeKind], own: RecipeKind) -> None:
    """A key that only another kind of draft takes keeps its default (one RecipeError naming it and its kind)."""
    mine = {**getattr(own.model_options, "model_fields", {}), **getattr(own.distill_options, "model_fields", {})}
    for kind in kinds:
        for options in (kind.model_options, kind.distill_options):
            for key, field in getattr(options, "model_fields", {}).items():
                if kind is own or key in mine or key not in type(section).model_fields:
                    continue
                if key not in getattr(options, "__annotations__", {}):
                    continue  # a key this kind takes from another's options (a P-EAGLE head's aux_layers): named there
                value = getattr(section, key)
                require(value == field.default, f"{section.section}.{key}", value,
                        f"{field.default if field.default is not None else 'null'} with model.draft_kind {own.name} "
                        f"(it is a key of {kind.title}: model.draft_kind {kind.name})", ["model.draft_kind"])


class ModelKeys(Section):
    """The model section's keys that every kind of draft shares (recipe_schema adds each kind's own, and
    model.draft_kind's choices)."""

    section = "model"
    kinds: ClassVar[tuple[RecipeKind, ...]] = ()   # the kinds recipe_schema was handed

    target: str = Field(min_length=1, description="Target LLM: local folder or hub id (required).")
    draft_kind: str = Field(min_length=1, description="The kind of draft to train.")
    target_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="dtype the frozen target is loaded in; auto = the dtype in its config.")
    draft_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype of the trainable draft weights (use train.bf16 for mixed precision).")
    tokenizer: str | None = Field(None, description="Tokenizer folder or hub id; null = the target's.")
    trust_remote_code: bool = Field(False, description="Allow model code from the hub (only for repos you trust).")
    attn_implementation: str | None = Field(None, description="eager, sdpa, flash_attention_2, ...; null = "
                                                              "transformers' pick.")
    _kind: Any = PrivateAttr(None)

    @property
    def kind(self) -> Any:
        """The kind model.draft_kind names (kinds.base.Kind: training, publishing, ... as well as recipes)."""
        if self._kind is None:
            self._kind = kind_called(type(self).kinds, self.draft_kind)
        return self._kind

    @model_validator(mode="after")
    def _rules(self) -> ModelKeys:
        """The kind's own rules (e.g. a standalone draft comes from exactly one of draft, draft_layers,
        draft_config); the other kinds' keys stay unset."""
        if type(self).kinds:
            other_kinds_keys_unset(self, type(self).kinds, self.kind)
            self.kind.check_model(self)
        return self


LORA_ALL_LINEAR = "all-linear"
ModuleNames = Annotated[list[Annotated[str, MinLen(1)]], MinLen(1)]


class LoraConfig(Section):
    """LoRA adapters on the draft (peft): only the adapters (and modules_to_save) train; the export is merged."""

    section = "lora"

    enabled: bool = Field(False, description="Train LoRA adapters instead of every draft weight (needs model.draft "
                                             "or model.draft_layers: pre-trained weights to adapt).")
    r: int = Field(16, gt=0, description="Rank of each adapter, > 0.")
    alpha: float = Field(32.0, gt=0, description="Scaling: the update is (alpha / r) * B @ A, > 0.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input, in [0, 1).")
    target_modules: ModuleNames | Literal[LORA_ALL_LINEAR] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        description="Linear layers to adapt (names or name suffixes), or 'all-linear' (every linear layer but the "
                    "lm_head).")
    modules_to_save: ModuleNames | None = Field(
        None, description="Modules trained in full next to the adapters (e.g. [lm_head]); null = none.")


class DistillKeys(Section):
    """The distill keys every kind shares. The per-token objective: a divergence between target and draft next-token
    distributions, plus optional CE, or a weighted combination of such losses (distill.losses.loss_mix)."""

    section = "distill"

    loss: Literal[LOSSES] | dict[str, JsonValue] = Field(
        "forward_kl", description=f"One of {', '.join(LOSSES)}; or a weighted combination {{name: weight}}, each "
                                  "weight a number >= 0 or a linear schedule {start, end, steps} over optimizer steps "
                                  "(held at end after steps; steps left out = the whole run). recipes/README.md, "
                                  "'Which loss to pick'.")
    beta: float = Field(0.5, ge=0, le=1, description="Mixture weight of the generalised JSD (loss jsd), in [0, 1].")
    temperature: float = Field(1.0, gt=0, description="Softmax temperature applied to both models' logits, > 0.")
    ce_weight: float = Field(0.0, ge=0, le=1, description="w in loss = (1 - w) * divergence + w * cross-entropy on "
                                                          "data tokens, in [0, 1]; 0 with a combination (put ce in "
                                                          "it).")
    chunk_size: int = Field(1024, gt=0, description="Token positions per chunk when computing logits (bounds "
                                                    "memory), > 0.")
    # cached teacher (recipes/README.md, "Cached teacher")
    teacher_cache: str | None = Field(
        None, description="Folder of the target's top-k log-probabilities (plus tail mass) at every training "
                          "position: built on first use (resumable), reused while target, tokenizer and rows are "
                          "unchanged; training then never runs the target. Needs temperature 1; null = run the "
                          "target at every step.")
    teacher_topk: int = Field(32, gt=0, description="k: cached tokens per position, in [1, the target's vocabulary "
                                                    "size].")
    teacher_cache_dtype: Literal["float16", "float32"] = Field(
        "float16", description="dtype of the cached log-probabilities (float16: half the bytes, ~5e-4 relative error).")
    # hidden-state cache of EAGLE-3 heads and DFlash drafts (recipes/README.md, "Hidden-state cache")
    hidden_state_cache: str | None = Field(
        None, description="eagle3, dflash: folder of the target's hidden states at the draft's layers and its final "
                          "hidden states at every training position: built on first use (resumable), reused while the "
                          "target's weights, the layers and the rows are unchanged; training steps then never run the "
                          "target (its lm_head gives the teacher's logits), and heads train under ZeRO-3 and FSDP2. "
                          "null = run the target at every step.")
    hidden_state_cache_dtype: Literal["bfloat16", "float16", "float32"] = Field(
        "bfloat16", description="eagle3, dflash: dtype the hidden states are stored in (bfloat16: exact for a "
                                "bfloat16 target, 2 bytes per value; float32: exact for float32 targets too, twice "
                                "the bytes).")
    # on-policy source (recipes/README.md, "On-policy")
    on_policy_fraction: float = Field(
        0.0, ge=0, le=1, description="lambda in [0, 1]: each training row is, with this probability, replaced by the "
                                     "draft's own continuation of its prompt (source 'draft', on-policy "
                                     "distillation); 0 = off.")
    on_policy_max_new_tokens: int = Field(
        128, gt=0, description="Tokens the draft samples per on-policy row (stops earlier at eos; the row stays <= "
                               "data.max_length).")
    on_policy_temperature: float = Field(1.0, ge=0, description="Sampling temperature of the draft's on-policy "
                                                                "samples; 0 = greedy.")
    @field_validator("loss")
    @classmethod
    def _loss_mix(cls, loss: str | dict[str, Any]) -> str | dict[str, Any]:
        """A combination is a valid distill.losses.loss_mix spec (its own errors name the sub-key)."""
        if isinstance(loss, dict):
            try:
                LossMix.parse(loss)
            except LossSpecError as err:
                raise rule_error(f"distill.{err.key}", err.problem) from None
        return loss

    @model_validator(mode="after")
    def _rules(self) -> DistillKeys:
        """What the loss, the cached teacher and on-policy rows need from each other."""
        teacher_terms = teacher_divergences(self.loss)
        if isinstance(self.loss, dict):
            require(self.ce_weight == 0.0, "distill.ce_weight", self.ce_weight,
                    "0 when distill.loss is a combination (give ce its weight inside distill.loss)", ["distill.loss"])
        require(self.on_policy_fraction == 0 or bool(teacher_terms), "distill.on_policy_fraction",
                self.on_policy_fraction, "0 with distill.loss ce (cross-entropy on the draft's own samples teaches "
                "nothing)", ["distill.loss"])
        if self.teacher_cache is not None:
            involves = ["distill.teacher_cache"]
            require(self.temperature == 1.0, "distill.temperature", self.temperature,
                    "1.0 with distill.teacher_cache (cached log-probabilities are at temperature 1)", involves)
            require(bool(teacher_terms), "distill.teacher_cache", self.teacher_cache,
                    "null with distill.loss ce (no teacher)", ["distill.loss"])
            require(self.on_policy_fraction == 0, "distill.on_policy_fraction", self.on_policy_fraction,
                    "0 with distill.teacher_cache (the draft's samples are not in the cache)", involves)
        return self

    @property
    def needs_teacher(self) -> bool:
        """Whether the loss has a divergence term (the target, or its cache, must be read)."""
        return bool(teacher_divergences(self.loss))

    def loss_at(self, step: int, total_steps: int) -> str | dict[str, float]:
        """distill_loss's `loss` at optimizer step `step` of total_steps: the name, or the combination's weights."""
        return self.loss if isinstance(self.loss, str) else LossMix.parse(self.loss).at(step, total_steps)


class EvalConfig(Section):
    """Acceptance measured with decode.measure.evaluate at every checkpoint (see docs/reference/interfaces.md)."""

    section = "eval"

    gammas: list[Annotated[int, Gt(0)] | Literal["auto"]] = Field(
        default_factory=lambda: [1, 2, 4], min_length=1,
        description="Draft lengths to measure; the best one goes into generation_config. 'auto' = chosen at every "
                    "step from the running acceptance and the measured costs (its row reports mean_gamma).")
    temperatures: list[Annotated[float, Ge(0)]] = Field(
        default_factory=lambda: [0.0], min_length=1,
        description="Sampling temperatures to measure; the first one picks the best checkpoint.")
    max_new_tokens: int = Field(64, gt=0, description="Tokens generated per prompt.")
    top_k: int | None = Field(None, gt=0, description="Top-k sampling filter (temperature > 0).")
    top_p: float | None = Field(None, gt=0, le=1, description="Top-p sampling filter (temperature > 0).")
    seed: int = Field(0, description="Sampling seed.")
    repeats: int = Field(1, gt=0, description="Timing repeats per prompt.")
    at_checkpoints: bool = Field(True, description="Measure at every checkpoint; false = only at the end of training.")
    held_in_prompts: int = Field(
        8, ge=0, description="Training prompts (a row's tokens before its first trained label, else its first "
                             "data.eval_prompt_tokens) whose acceptance is measured beside the held-out prompts' at "
                             "every measurement: held_in_acceptance_rate and held_in_mean_accepted_tokens in "
                             "acceptance.jsonl, TensorBoard and the model card; 0 = none.")
    held_in_warning: float = Field(
        0.5, ge=0, le=1, description="Warn (one line) when held-out acceptance falls below this fraction of held-in "
                                     "acceptance: the draft fits its training prompts, not new ones; 0 = never.")
    chat_template: Literal["auto", "on", "off"] = Field(
        "auto", description="Render acceptance prompts with the tokenizer's chat template: auto = conversations only "
                            "(in a chat-format run every prompt is a conversation); on = every prompt (error without "
                            "a template); off = raw text (decode.inputs.prompts).")
    compile: bool = Field(
        False, description="Measure on the static-cache, torch.compiled decode path (compiled once, reused at every "
                           "checkpoint).")
    serving_engine: Literal["none", "vllm"] = Field(
        "none", description="After export, also measure the exported draft inside a serving engine: vllm = vLLM's "
                            "offline LLM (the serving venv of `make serving`) at the integer gammas and the first "
                            "temperature; train_results.json and the model card then show vLLM's tau next to ours.")
    vllm_python: str | None = Field(
        None, description="Interpreter with vLLM for serving_engine: vllm; null = $SPECDISTILL_VLLM_PYTHON, else "
                          ".venv-vllm/bin/python.")
    vllm_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto", description="The dtype vLLM holds the target (and the draft) in, for serving_engine: vllm and "
                            "data.target_engine: vllm: auto = bfloat16 when vLLM runs on CUDA, else float32.")

    @property
    def fixed_gammas(self) -> list[int]:
        """The integer gammas (without "auto"): what vLLM and a served generation_config can draft."""
        return fixed_gammas(self.gammas)

    def decoder_settings(self, temperature: float, fixed_gammas_only: bool = False):
        """These settings as the decoder's decode.measure.settings.EvalSettings at one temperature: the one translation,
        used by the checkpoint measurements and the export's vLLM measurement alike (``fixed_gammas_only``: vLLM
        drafts a fixed number of tokens)."""
        from decode.measure.settings import EvalSettings

        return EvalSettings(gammas=self.fixed_gammas if fixed_gammas_only else list(self.gammas),
                            temperature=temperature, max_new_tokens=self.max_new_tokens, top_k=self.top_k,
                            top_p=self.top_p, seed=self.seed, repeats=self.repeats, compile=self.compile)

    @model_validator(mode="after")
    def _rules(self) -> EvalConfig:
        """vLLM drafts a fixed number of tokens: it needs an integer gamma."""
        require(self.serving_engine == "none" or bool(self.fixed_gammas), "eval.serving_engine",
                self.serving_engine, "none, unless eval.gammas holds an integer gamma (vLLM drafts a fixed number)",
                ["eval.gammas"])
        return self


class HubConfig(Section):
    """Publishing the exported draft (distill.publish.hub.push_to_hub)."""

    section = "hub"

    push_to_hub: bool = Field(False, description="Push the exported best draft at the end of training.")
    repo_id: str | None = Field(None, description="Hub repository, e.g. you/qwen2.5-0.5b-draft (required to push).")
    private: bool = Field(True, description="Create the repository as private.")

    @model_validator(mode="after")
    def _rules(self) -> HubConfig:
        """A push needs a repository."""
        require(not self.push_to_hub or bool(self.repo_id), "hub.repo_id", self.repo_id,
                "a hub repository id when hub.push_to_hub is true", ["hub.push_to_hub"])
        return self


# ---------------------------------------------------------------------------------------------------------------
# The whole recipe, and the rules between its sections
# ---------------------------------------------------------------------------------------------------------------

class Recipe(Section):
    """A whole training run; each attribute is one section of the YAML file. This class holds the shared keys;
    recipe_schema(kinds, default) makes the one a recipe file is read with."""

    model: ModelKeys
    data: DataConfig
    lora: LoraConfig = Field(default_factory=LoraConfig)
    distill: DistillKeys = Field(default_factory=DistillKeys)
    train: TrainConfig = Field(default_factory=TrainConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    hub: HubConfig = Field(default_factory=HubConfig)
    _kind_defaults: dict[str, Any] = PrivateAttr(default_factory=dict)

    @property
    def kind_defaults(self) -> dict[str, Any]:
        """The keys (section.key -> value) this recipe took from its draft kind's defaults (kinds/<kind>)."""
        return dict(self._kind_defaults)

    @classmethod
    def section_types(cls) -> dict[str, type[Section]]:
        """Each section's name -> its class, in the order of SECTIONS."""
        return {name: cls.model_fields[name].annotation for name in SECTIONS}

    @model_validator(mode="after")
    def _kind_supplies_its_defaults(self) -> Recipe:
        """Each key of the kind's defaults that the recipe does not set takes the kind's value (then counts as set,
        so a saved recipe.yaml holds it). What works for a kind of draft, where the recipe is silent; an explicit
        value always wins, and the run log names what the kind supplied."""
        for key, value in self.model.kind.defaults.items():
            section_name, name = key.split(".")
            section = getattr(self, section_name)
            if name not in section.model_fields_set:
                setattr(section, name, value)
                self._kind_defaults[key] = value
        return self

    @model_validator(mode="after")
    def _across_sections(self) -> Recipe:
        """Rules that involve two sections (each section has already checked its own keys)."""
        other_kinds_keys_unset(self.distill, type(self.model).kinds, self.model.kind)
        self.model.kind.check_recipe(self)  # what the kind cannot combine with (first: its defaults may be the cause)
        require(self.data.loss_tokens == "assistant" or self.distill.on_policy_fraction == 0, "data.loss_tokens",
                self.data.loss_tokens, "assistant with distill.on_policy_fraction > 0 (an on-policy row's prompt is "
                "what comes before its first trained token)", involves=["distill.on_policy_fraction"])
        return self


def recipe_schema(kinds: Sequence[RecipeKind], default: RecipeKind) -> type[Recipe]:
    """The Recipe class for ``kinds``: model.draft_kind names one of those that train (``default`` where a recipe
    is silent), and the model and distill sections hold each kind's own keys besides the shared ones (the base
    classes of a pydantic model contribute their fields last first: the shared keys come first, then the kinds' in
    the order given; a kind whose options extend another's, as a PARD draft takes the standalone draft's keys,
    brings them through its own class)."""
    trainable = tuple(kind.name for kind in kinds if kind.trains)
    if default.name not in trainable:
        raise ValueError(f"the default kind {default.name!r} does not train")
    model = type("ModelConfig", (*mixins([kind.model_options for kind in reversed(kinds)]), ModelKeys), {
        "__module__": __name__, "kinds": tuple(kinds),
        "__doc__": "Which target to distil from and how the draft is made: its kind (model.draft_kind, kinds/) and "
                   "that kind's keys: " + "; ".join(f"{kind.name}: {kind.summary}" for kind in kinds
                                                    if kind.trains) + ".",
        "__annotations__": {"draft_kind": Literal[trainable]},
        "draft_kind": Field(default.name, description="; ".join(
            f"{kind.name}: {kind.summary}" for kind in kinds if kind.trains) + "."),
    })
    distill = type("DistillConfig", (*mixins([kind.distill_options for kind in reversed(kinds)]), DistillKeys), {
        "__module__": __name__,
        "__doc__": "The distill section: the shared keys (DistillKeys) and each kind's own.",
    })
    return type("Recipe", (Recipe,), {
        "__module__": __name__, "__doc__": Recipe.__doc__.split(" This class")[0],
        "__annotations__": {"model": model, "distill": distill},
        "distill": Field(default_factory=distill),
    })
