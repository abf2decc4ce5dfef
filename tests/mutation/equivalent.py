"""Mutants shown to be equivalent: each key (see ``engine.Mutant.key``) with the reason the mutated
operator cannot be told apart from the reference on the inputs its ABI admits, under the comparator the
ABI applies. The mutation runner reports a survivor that is not listed here, and a listed mutant that
a contract kills (so this list cannot go stale unnoticed; tests/test_mutation_tool.py checks that every
key still names a generated mutant). Reviewed by hand, one key at a time."""

# reasons
LAYER_LAST_PLUS = "The request's kv length only caps (pos + 1) // 128 for its real rows: max position + 1 already caps none of them (each real row's own (pos + 1) // 128 is at most it), so max position + 2 caps none either."
LAYER_NO_REAL_ROWS = 'With no real rows every row is padding and its slots are set to -1 after hca_topk: the kv length given for them is never read.'
LAYER_FRESH_TOPK = "hca_topk returns a tensor of its own: writing its padding rows in place changes no other tensor."
LAYER_PADDING_SLOTS = "A padding row's compressed slots are never read: the prefill attention (v4_attention_stage's prefill form) attends nothing for rows from num_tokens on and zeroes them."
DRAFTER_LIST_PAD = ("Columns of a request's visible list past its count are never read (dspark_attention masks the "
                    "list by swa_lens): their width and fill value change no output.")
DRAFTER_LAST_DIV = ("last and page are non-negative integers and the table width an integer: last // page >= width "
                    "exactly when last / page >= width.")
LAYER_LIMIT_DIV = 'max_position_embeddings is a multiple of 128 in every preset, so the true quotient is the same integer value, and min() with index_topk gives the same limit.'
LAYER_REQ_DIV = "token_to_req is read by the compressor as int(token_to_req[t]): int(t / seq) truncates to t // seq for t >= 0."
LAYER_ROPE_BF16 = 'The compressed RoPE rows meet FP32 rows (rope_interleave in the publications, the FP32 query rotation of the indexer): a BF16 row promotes to FP32 exactly, so every product is the same.'
DTYPE = 'An internal integer or index dtype: every value the operator handles here fits the narrower type (positions < 2^20, pages < 2^24, slots < 2^31, codes < 256) and the result is cast to its ABI dtype before it leaves the operator.'
CASTNOOP = 'Drops a cast to the dtype the value already has at that point (or the assignment target casts it the same way).'
DIM = '-1 and 1 (or 0) name the same dimension of the 1-D or 2-D tensors this code handles.'
ZIP = 'zip(strict=...) over sequences whose lengths are equal by construction (checked just before).'
BLOCKING = 'Changes only how rows are split into concurrent blocks, or the thread count: blocked quantization is byte-identical to one pass (contracts/test_quant.py::test_blocked_quantization_equals_one_pass).'
HOST_E8M0 = 'The host E8M0 decode path: operators decode with the device rule (scale_values(device=True)); the host rule gives the same values for codes 0..254, and code 255 is replaced by NaN in mx_dequantize on either path.'
BITS = 'Keeps the byte pattern: a re-view of the same bytes (int8 vs uint8), or a comparison torch makes in the wider type (int8 -1 == 255), or e8m0_decode re-viewing non-uint8 codes as uint8.'
LUT = "e2m1_encode and _fp4_luts run only at import, on the pair table's class representatives (multiples of 1/8 up to 9, exact in BF16, saturating past 6), for which the mutated step yields the same code."
UNPACK = 'Payload bytes are uint8 already; read as int8, the high nibble becomes (b >> 4) - 16, which indexes the same entry of the 16-entry table from its end.'
E2M1_TABLE = 'The E2M1 table values are exact in BF16 and are multiplied by the FP32 scale in FP32.'
GROUPS_CAST = 'Input casts before .float(): every accepted input dtype (FP64, FP32, BF16, FP16) reaches FP32 with the same value either way.'
PACK = '_e2m1_pack always receives sign_of from its caller; the exact-flag and index dtypes do not change the integer index it gathers with.'
FLOOR128 = '2^-128 and 2^-127 floors give the same exponent after the clamp to -127.'
EXPCLAMP = 'The exponent is always inside the clamp: raw >= 2^-127 by the floors and <= FLT_MAX/6, so the clamp is inactive.'
SHIFT = 'Folding the factor 4 into the power-of-two reciprocal or multiplying afterwards are both exact scalings of values that round to E2M1 codes.'
SATURATE = "torch's FP32 -> float8_e4m3fn cast saturates at 448, so the explicit clamp of the E4M3 scale is already implied."
K_UNUSED = 'No rule has MXFP8 payloads with E4M3 scales: this branch value is never used.'
E4M3_BF16 = 'E4M3 values (3 mantissa bits) are exact in BF16.'
CLAMP_PASS = 'Only decides whether to run a saturation pass that cannot change any code (the pair tables saturate up to J_MAX).'
Y_FP32 = 'y is FP32 at this point for every rule.'
CONTIG = 'The tensor is already contiguous.'
NEG_SLOT = ('Masks unpublished rows with slot -2 instead of -1: cache_publish writes only slots >= 0, so every negative '
            'slot skips its row alike.')
BINDING_DTYPE = ('The compiled-dtype clause runs only when a device binding passes dtype= (backends/pypto/v41.py); the '
                 'reference passes None, so no torch-backend contract reaches it. '
                 'contracts/test_rope.py::test_a_compiled_table_dtype_refuses_another pins the clause by a direct call.')
TORCH_FP64_BF16 = ("torch casts FP64 to BF16 through FP32 (1 + 2^-8 + 2^-30 becomes 1.0 either way), so an FP32 cast "
                   "before the BF16 one changes no byte on any input; a kernel that rounds the exact sum once fails "
                   "contracts/test_o_proj.py::test_o_proj_stages_the_latent_in_fp32_before_bf16.")
FLOOR_BF16 = 'The scale floors (2^-127, 2^-126, 2^-9) are exact in BF16, and the maximum is taken in FP32.'
NONTENSOR = "Differs only for non-tensor inputs; the operator's ABI inputs are tensors (a list is a harness convenience)."
UNREACHABLE = 'A guard the operator never reaches with inputs that pass its own earlier checks (paged_slots is only called by build_forward_metadata with in-range requests, positive block sizes and allocated pages).'
RATIO = '(p + 1) % r == (p - 1) % r for the V4.1 ratios r in {1, 2} (the config rejects any other ratio).'
ONLY_COMPLETE = 'Every call that relies on only_complete passes it; the window calls use divisor 1, for which the publish condition is always true.'
WINDOW_POS = 'window_metadata only sees positions >= 0 (tokens of requests; padding rows are filled afterwards), for which lens >= 1.'
PAD_CAST = 'The field is cast to its ABI dtype when ForwardMetadata is assembled (pad), so this cast is redundant.'
SLAB_CAST = 'Assigned into the INT32 slab tensors, which casts the same way.'
VALID_BOOL = "valid is BOOL by the ABI (MD-25), and sp_shard's output is checked to be BOOL."
EMPTY_PAD = 'Only differs when the padding slice is empty, where both give no padding row.'
ROPE_CAST = 'Position ids index the table the same way as INT32 or INT64.'
EPS_DEFAULT = "rms_norm's default eps is never used: compressor_ratio2 passes its own eps (whose mutation is killed)."
LATENT_CAST = 'The latent row is assigned into the BF16 latent tensor, which rounds it the same way.'
KEEPDIM = 'The pooled row is 1-D: keepdim changes nothing.'
NORM_FP32 = "The RMSNorm weight is FP32, as the reference's weights are."
INPLACE = 'state_cache is InOut in the ABI: updating it in place and returning it is what the device kernel does.'
EMPTY_REQ = "An empty request's loop body never runs either way."
POS0 = 'Position 0 is even: it never closes a pair, and state writes are decided by a separate test.'
MASKED_ROWS = 'Masked positions read some row but their scores are set to -inf afterwards.'
EMPTY_SCORES = 'With no visible position the general path returns the same [T, width] scores / all -1 selection.'
TORCH_F64 = 'The value is FP32 already after _bf16, or torch rounds FP64 to BF16 through FP32 (the same double rounding).'
TIE = "Changes only the order among exactly tied scores: §5.3 accepts any tie order at the cutoff, and torch's CPU sort is stable for these sizes anyway."
HAS1 = 'A token with one visible position has exactly one finite block, which Top-K keeps anyway.'
LASTCLAMP = 'last <= nblocks - 1 whenever compressed_lens <= the score width, which holds because scores past compressed_lens are -inf (§5.1).'
LASTMIN = "(lens - 1) // block is the same with lens clamped at 1 or 0 for block sizes >= 2 (the spec's block is 8)."
NBLOCKS0 = 'Only differs when there is no block at all, where nothing is selected.'
ALIAS = 'forced replaces best afterwards; the aliasing is never observed.'
U8OUT = 'The mask is copied into the uint8 output, which casts it.'
LAYER_CONFIG = 'resolve_schedule only asks for layer ids 0..n-1, which pass either way (the validation itself is tested on the config by test_layer_config_rejects_out_of_range).'
CACHELAYOUT = 'A field default of CacheLayout: layouts are built by the contracts with the real module, so the shadow class is never instantiated.'
STATE_CAST = 'Assigned into the FP32 state payload, which casts the same way.'
ROWS1D = 'A 1-D tensor reshaped either way is one row.'
LEAD1D = 'For 1-D input shape[:-1] is () either way.'
NAN_DIFF = 'For finite inputs nan_to_num is the identity (an overflowing a - e is +-inf either way); rows with a non-finite value are reported by the non-finite branch before diff matters.'
REF_RMS_NAN = 'ref_rms of a row whose reference is non-finite is never used: such rows are reported by the non-finite branch first.'
MASK_GOOD = 'Bad rows are exactly those whose larger excess exceeds 1, so the masking of good rows below that never changes the argmax.'
TIE_CLAUSE = 'Message only, and only on an exact tie of the two excess ratios, where either clause is a true report.'
COS_EQ = 'Separable only by a cosine computed as exactly the double 0.9999; no FP64 input was found that produces it (searched 80,000 constructions); the clause is tested at 1 -/+ 1e-6 of its bound.'
PAD_DTYPE = "x != 0 and isfinite read the same in the slab's own dtype as in FP64."
SINK_FP32 = ("The sink is FP32 by the operator's ABI: keeping it FP32 or widening it gives the same logit, and "
             "torch.cat promotes it to FP64 with the scores either way.")
TP_DEFAULT = ("tp only decides the decode SWA leaf's TP8 refusal: with any default other than 8 the call accepts "
              "and rejects exactly the same arguments.")
HALF_SENTINEL = ("The value taken when the table is not 2-D never matters: a table that is not 2-D is rejected by "
                 "the next check whatever half is.")
INT_FLOAT = "An int and the equal float compare equal: the shape check accepts and rejects the same inputs."
INVERSE_DEFAULT = "Every operator that rotates passes inverse= explicitly (o_proj passes True), so the default is never used."
FP32_TABLES = ("The FP32 cos/sin tables promote the BF16 operands to FP32 (and torch.cat promotes to FP32), so the "
               "explicit .float() changes no value.")
MX_EXACT_BF16 = ("Decoded MX cache values (E4M3 or E2M1 payload times a power-of-two or E4M3 scale: at most 7 "
                 "significant bits) are exact in BF16, so reading them as FP32 gives the same values.")
SWA_NO_COMPRESSED = ("SWA attends to no compressed row: an index tensor holding only -1 selects nothing whatever its "
                     "width or integer dtype, and the placeholder rows it points past are never read.")
R1_R2_LAYOUT = ("The ratio-1 and ratio-2 compressed caches share payload/scale shapes, dtypes and codec (§2.1); the "
                "layout only differs in tokens_per_row and owners, which publish and read never use.")
PREMASKED_SLOTS = ("ForwardMetadata gives ratio-2 compressed slots only at the pair-closing positions of requests "
                   "with a state block, exactly where the compressor publishes, so the mask removes no slot (it is "
                   "kept for imported upstream trees whose slots are not pre-masked).")
LAYOUT_UNUSED = ("Read by no operator: the half-layer validates, publishes and reads the window, compressed and index "
                 "caches through their payload/scale shapes and codec; the owners, tokens_per_row and the state_r2 "
                 "layout are documentation (the ring state is a raw FP32 tensor the compressor checks).")
EPS_PASSED = "The half-layer passes eps explicitly, so this default is never used (its own eps mutation is killed)."
TOPK_SCALE = ("Scales every index head weight by a power of two (index_head_dim and index_n_heads are powers of two "
              "in every preset: 32/4 tiny, 128/32 FLASH), exact in BF16: every score of a token scales by it, so "
              "the Top-K rows and the candidate blocks -- the only outputs the weights reach -- are unchanged.")
ROW_BLOCKS = ("Changes only how the row bound splits rows into concurrent blocks, or its thread count: each row's "
              "statistics reduce over that row alone, so any blocking gives the same values (contracts/"
              "test_comparators.py::test_row_bound_fast_path_agrees_with_fp64_in_every_block).")
RECHECK_MORE = ("Only makes the FP32 pre-pass clear fewer rows (a larger error estimate or margin, every row "
                "judged in FP64, or FP64 inputs judged in FP64 anyway): verdicts come from FP64 statistics either "
                "way, only slower.")
MARGIN = ("Narrows the worst-case margin of the FP32 pre-pass (to a half or less): torch's FP32 norms stay within "
          "about 2^-22 relative of FP64 on these widths, far inside even the narrowed margin, so no row is "
          "cleared differently (the BF16 and FP32 rows at 1 -/+ 1e-6 and within 0.5 % of the bound are "
          "rechecked under every variant).")
FP64_ROUTE = ("FP64 inputs through the FP32 pre-pass: values outside the FP32 range give a non-finite statistic and "
              "are judged in FP64; a rounding of 2^-24 per element moves a row's statistics by far less than the "
              "1e-6 + 1 % bound, so only clearly-good rows are cleared.")
PROMOTE = ("a - e promotes to the wider dtype with e already converted (FP64, or FP32 in the pre-pass), exactly; "
           "isfinite reads the same in either dtype.")
MSG_CAST = ("Message only: the printed element values are exact in either dtype, and the printed peak column can "
            "change only between columns whose differences round to the same value.")
EXCESS_TIE = "Differs only when a row's FP32 excess equals 1 - margin exactly, where either choice is sound."
SCALE_NEAR_TIES = ("Scales every index head weight by one positive constant (1/2 at tiny's 4 heads, 8^-1/2 in the "
                   "FLASH-geometry case): the ranking is scale-invariant, so only scores within one BF16 rounding of "
                   "each other can swap, inside the 1.5 % Top-K cutoff tolerance (§5.3); the exact candidate mask "
                   "would show such a swap at a block edge, and none occurs on these fixtures.")

PROMOTE = "Drops a widening of a value the ABI already hands over in FP32 (mixes, scales, bases, route weights, the router bias), or one that torch's type promotion performs at the next arithmetic (BF16 x FP32 -> FP32) with the same value."
MASK01 = 'The 0/1 row mask of the zero tail is exact in BF16 and as bool; multiplying the FP32 mixes by it gives the same FP32 values.'
EPS_ROUTER = "The router's normaliser adds 1e-20 to a sum of positive sqrt-softplus scores many orders of magnitude larger: in FP32 neither the offset's size nor its sign changes a bit."
STABLE_TIES = 'torch.argsort with stable=False returns equal router keys in index order on this build (16 experts in the tiny preset); the ties contract (test_ties_go_to_the_lower_expert_id...) would fail the moment it did not.'
VIEW = 'Drops a .contiguous() of an expanded view: the values are the same and every consumer reads values.'
DEFAULT_DP = 'lm_head passes dp explicitly (dp = tp); the default of lm_head_layout is never used by the operator.'
DEFAULT_EPOCH = 'The default attention epoch is only validated (1..1000): a default of 2 is as valid as 1 and changes no result.'
REPLICAS = 'Replicated wiring: every rank holds the same output bytes (one replica stacked tp times), so any replica index gives the same rows.'

ENGRAM_EXACT_SUM = ("Sums the rank partial lookups in BF16 instead of FP32: each element has exactly one non-zero "
                    "contributor (the rank holding the row), so the sum is that BF16 value either way.")
ENGRAM_KV_FP64 = ("Keeps the projected key / value in FP64 instead of rounding them to FP32: the difference is 2^-24 "
                  "relative, far below the BF16 output step (2^-8); it can move an output only when the FP32 sum "
                  "lands within 2^-24 of a BF16 rounding midpoint, which no fixed input can aim at through the "
                  "sigmoid, and which the device's own FP32 accumulation order would not reproduce either.")
ENGRAM_UNFLATTEN = "unflatten(-1, ...) and unflatten(1, ...) are the same dimension of the 2-D projection."
ENGRAM_MASK_CAST = ("The row mask multiplies BF16 rows: a bool mask promotes to the rows' dtype in the product, so "
                    "casting it first changes nothing.")

SAME_WIDTH = "Every owner slab has the same width (ceil(capacity / tp)), so any rank's bounds give it."
SAME_LENGTH = "zip over the ranks' bounds and the ranks' mixes: both lists have one entry per rank."
ONE_INPUT = ("Every EP rank's rows have the same width D (moe_ep checks the shapes), and a call without ranks is "
             "refused before this line, so the fallback is never taken.")
FRESH_COUNT = ("Returns a row of the per-expert count table instead of a copy: nothing writes the counts after they "
               "are returned (the comparators read them).")
NORM_FP32 = ("rms_norm takes the FP32 view itself and the result is cast to BF16 once either way: casting the "
             "hidden to FP32 first changes nothing.")

NONEMPTY_PARTS = ("Every request appends one range (possibly empty) to the lists _cat joins, and a call has at least "
                  "one request, so the empty-list fallback is never taken.")

INT_BOUND = ("pos // page >= n and pos / page >= n agree for integers pos, page and n: the bound check of the state "
             "table is the same either way.")

INT8_CLAMP = ("The per-row codes never leave +-scale_max: amax is at least every |v| of the row, so |v| · scale_max / "
              "amax <= scale_max and the clamp (kept as upstream has it) changes nothing.")

FIRST_ROW = ("Rotates one more row of the batch along with the closing token's row; only row 0 (the closing "
             "token's) is kept.")

ZERO_SCALE = "For an all-zero row log2(0) = -inf and 2^-inf = 0: the zero scale comes out either way."
POW2_BF16 = ("The row divided by a power-of-two scale is exact in BF16 as in FP32 (the values are BF16 already), "
             "so the E4M3 payload and the amax are the same.")
ZERO_ROW_DIVISOR = "Only a zero row takes the fallback divisor: 0 divided by 1 or by 2 is 0."

V4_MASK = ("The -1e20 additive mask of an invalid key only has to lie far below every real score: each tile's "
           "probabilities are multiplied by the validity mask, and an all-invalid tile's weight exp(-1e20 - max) and "
           "exp(-2e20 - max) are both 0.")
V4_SENTINEL = ("csa_compressed_indices feeds paged_compressed_rows inside v4_attention, which reads every slot < 0 as "
               "'no row': a -2 sentinel is consumed exactly as -1.")
V4_PROMOTE = ("torch promotes the mixed operation to the wider float type (FP32 with FP64 -> FP64; BF16 or INT64 with "
              "FP32 -> FP32) and the dropped or narrowed cast was to that same type, so every value is unchanged.")
V4_EVEN_ROPE_SHAPE = ("tokens // seq and tokens / seq are equal for the request-major batches the shape check admits (a float equal to an int compares equal inside a shape tuple).")
V4_GROUP_IN = ("group_in = heads * dim / groups is a whole number for every V4 preset (heads * head_dim divisible by "
               "o_groups), and a float equal to an int compares equal inside a shape tuple: the check (only the check "
               "computes it since the input checks were factored out) accepts and refuses the same wo_a.")
V4_EVEN_ROPE = "rope // 2 and rope / 2 are equal for the even rope widths V4Config admits; the comparison is the same."

V4_SCALES_FP32 = ("check_query_inputs admits qr_scale and wq_b_scale only as FP32 (the ABI's dtype; any other is "
                  "refused, contracts/test_v4_indexer.py), so the cast is to the dtype they already have.")
V4_ROPE_FP32 = ("rope_interleave computes every element in FP32 (the unrotated dims included) and returns the input "
                "dtype, so q reaches its BF16 rounding through FP32 either way.")
V4_TRUNC = ("The visible length is only consumed through int(): truncating the non-negative quotient equals the floor "
            "division.")
V4_WEIGHTS = ("FP32 vs FP64 rounding of the head weights scales a score by at most 1 + 2^-24: the hand vectors use "
              "weights that are exact in FP32, and the ABI's score bound is 1/128 relative.")

V4_PAD_SENTINEL = ("The padding rows' compressed slots are read by paged_compressed_rows, which treats every slot < 0 "
                   "as 'no row': -2 is consumed exactly as -1.")

V4_BF16_VIA_FP32 = ("torch converts FP64 to BF16 through FP32 (c10::BFloat16 is built from a float), so the explicit "
                    "FP32 step before the BF16 rounding changes nothing.")

V4_FP32_REDUCTION = ("A reduction (matmul, sum of squares) is evaluated in FP64 and rounded to FP32 once, to stand for the "
                     "device's own FP32 accumulation order, which the ABI leaves open; without that rounding a result "
                     "moves by under 2^-24 relative, far inside the one-BF16-step bound the outputs are judged by.")

V4_SWA_PLACEHOLDER = ("The SWA stage hands v4_attention a placeholder compressed cache and table that it never reads (SWA "
                      "has no compressed slots): their size and dtype do not matter.")


V4_DIV_COMPARE = ("p / k >= n and p // k >= n agree for integers p >= 0, k > 0, n >= 0 (both say p >= n·k).")
V4_EMPTY_CHUNK = ("The chunk's first position is only read when the chunk has rows: with num_tokens = 0 every check "
                  "runs over empty tensors, whatever the placeholder.")
V4_OPS_SAME = ("Under the reference backend a composition receives the reference's own operators as ops; falling back "
               "to the module's defaults runs the very same functions.")


V4_TILE_PADDING = ("A tile's rows past the packed end are padding rows of both stages (num_tokens is the tile's real rows), "
                   "whose contracts show padding rows leave no trace and their inputs untouched: a tile with more, "
                   "fewer or aliased padding rows gives the same real rows and cache.")


V4_NEG_FIRST = ("Within a request's rows a negative later position means a negative first one or a gap, both refused "
                "already; testing more columns for < 0 refuses the same inputs, naming the same request.")


V4_CLAMP_NOOP = ("|xg| <= amax, so |xg · (127 / amax)| <= 127 · (1 + 2^-23), which rounds to at most 127: the clamp "
                 "never acts.")
V4_LOGITS_FP64 = ("Keeping the router logits in FP64 instead of rounding them to FP32 once moves a weight by at most "
                  "2^-24 relative (the contracts' bound is 1e-5) and a route only at a tie closer than 2^-24, which "
                  "upstream's score-route comparator accepts either way (swaps within 1e-4 + 2e-5·|s|).")
V4_STABLE_CPU = ("torch's CPU sort keeps equal keys in index order at these sizes with stable=False too (the tie test "
                 "test_v4_gate.py::test_tied_experts_go_to_the_lower_id passes under this mutant); that test pins the "
                 "rule for every backend.")


V4_INT8_PRODUCT_FP64 = ("Keeping int8_matmul's exact integer product in FP64 instead of its FP32 cast (exact while the sum "
                        "stays under 2^24, a 2^-24 rounding beyond, e.g. Pro's 127 · 127 · 7168) carries the row in FP64 "
                        "into its scale factors: it moves the MoE, MTP-projection and output-projection rows far below "
                        "every bound and flips a BF16 rounding only at a tie -- the Pro-geometry contracts run it and "
                        "cannot see it, nor should any comparator.")


V4_COMPOSES_DEFAULT = ("Under the reference backend the composed operator is the reference's own, which carries "
                       "composes_operators = True, so getattr's default is never read.")


V4_ONE_ROW_SLICE = ("rope_interleave of rows t .. t + 1 instead of t alone: only the rotated slice's row 0 is kept, and it "
                    "is row t either way.")
V4_PADDING_POSITION = ("A prefill padding row's position only picks its RoPE row, and the stage zeroes that row's outputs "
                       "and writes no kv row for it: row 0 or row 1 of the table, nothing of it is visible.")


# reasons of the issue #26 mutant classes (reorder, move-clamp, stage-dtype), one survivor at a time
GROUPS_BF16_TO_FP32 = 'A BF16 input no longer listed as a float type is converted to FP32 first, exactly; _quantize_rows takes .float() of the groups right after, so the values are the same.'
ZERO_PLACEHOLDER = "The SWA layer's placeholder compressed row: zeros, never selected (its top-k is all -1); BF16 and FP16 zeros, and the FP32 the attention promotes them to, are the same values."
COUNT_ORDER = 'The loop builds integer counts and one list per destination; reversing it reverses the order in which destinations are visited, not the order within any list, and integer sums do not depend on order.'
ONE_K_PER_EXPERT = 'A token routes to distinct experts, so for one expert at most one k matches: the order of k appends at most one slot, and the list order does not change.'
CLAMP_COMMUTES = 'min(max(a, 0), w) equals max(min(a, w), 0) for the window w >= 1: the clamp commutes with the minimum.'
PER_TOKEN_ROWS = 'Each iteration writes only its own token row (out[t], closes[t]); the += is list concatenation of the window, not a running sum, so the visiting order cannot change any value.'

DSPARK_IDS = ("markov_head takes INT32 or INT64 ids alike (each checked in [0, vocab) first), greedy_pick's INT32 ids "
              "are those same ids, and the drafts are cast to INT32 before they leave the operator.")
DSPARK_ROWS_FLOAT = ("An integer count computed as a float of the same value (the dividend is a multiple: a cache "
                     "holds whole head_dim rows, H a multiple of o_groups in every preset) compares and bounds "
                     "the same; only a printed message would show 256.0 for 256.")


DSPARK_SHIFT = ("The softmax's stabilising shift cancels between numerator and denominator: any shift inside FP64's "
                "exponent range (the scores here are O(10)) gives the same probabilities far below the heads' BF16 "
                "rounding.")


EQUIVALENT: dict[str, str] = {
    # lookup_embedding: index_select returns a contiguous tensor; it takes INT32 or INT64 indices alike, and every id
    # is checked to lie in [0, vocab) before, so an INT32 index holds it
    'kernels.v4.lookup_embedding:lookup_embedding:drop-call:embed_weight.index_select(0, input_ids.to(torch.int64)).c...[contiguous]->(skipped)#0': 'index_select already returns a contiguous tensor.',
    'kernels.v4.lookup_embedding:lookup_embedding:drop-call:input_ids.to(torch.int64)[to]->(skipped)#0': 'index_select takes INT32 or INT64 indices alike (the ids are 1-D INT32/INT64, checked).',
    'kernels.v4.lookup_embedding:lookup_embedding:name:int64->int32#0': 'Every id is checked to lie in [0, vocab) first, so its INT32 form is the same index.',
    'contracts.checks.precision:check_output_budget:cmp:cosine < budget.min_cosine[Lt]->LtE#0': COS_EQ,
    'contracts.checks.precision:check_owner_rows:const:True->False#1': ZIP,
    'contracts.checks.precision:check_owner_rows:drop-call:slab[count:].detach().cpu().to(torch.float64)[to]->(skipped)#0': PAD_DTYPE,
    'contracts.checks.precision:_lead:cmp:actual.ndim > 1[Gt]->GtE#0': LEAD1D,
    'contracts.checks.precision:check_row_precision:drop-call:torch.maximum(rms_excess, peak_excess).masked_fill(~bad, ...[masked_fill]->(skipped)#0': MASK_GOOD,
    'contracts.checks.precision:check_row_precision:drop-unary:-1.0[USub]->(none)#0': MASK_GOOD,
    'kernels.cache:CacheLayout:const:1->2#0': CACHELAYOUT,
    'kernels.cache:_check_slots:drop-call:torch.as_tensor(slots).to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.cache:_check_slots:name:int64->int32#0': DTYPE,
    'kernels.cache:cache_publish:drop-call:values[live].to(torch.float32)[to]->(skipped)#0': STATE_CAST,
    'kernels.metadata:_parse_int_vector:drop-call:tensor.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.metadata:_parse_int_vector:drop-unary:not isinstance(value, torch.Tensor)[Not]->(none)#0': NONTENSOR,
    'kernels.metadata:_parse_int_vector:name:int64->int32#0': DTYPE,
    'kernels.metadata:_parse_table:drop-call:tensor.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.metadata:_parse_table:drop-unary:not isinstance(value, torch.Tensor)[Not]->(none)#0': NONTENSOR,
    'kernels.metadata:_parse_table:name:int64->int32#0': DTYPE,
    'kernels.metadata:_source_fields:binop:positions + 1[Add]->Sub#1': RATIO,
    "kernels.metadata:_source_fields:drop-call:torch.div(positions + 1, ratio, rounding_mode='floor').to...[to]->(skipped)#0": PAD_CAST,
    'kernels.metadata:_source_fields:drop-call:torch.where(complete, positions + 1 - ratio, -1).to(torch...[to]->(skipped)#0': PAD_CAST,
    'kernels.metadata:_source_fields:name:int32->int64#2': PAD_CAST,
    'kernels.metadata:_source_fields:name:int32->int64#3': PAD_CAST,
    'kernels.metadata:compressor_metadata:drop-call:kv_seq_lens.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.metadata:compressor_metadata:drop-call:query_start_loc.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.metadata:compressor_metadata:name:int64->int32#0': DTYPE,
    'kernels.metadata:compressor_metadata:name:int64->int32#1': DTYPE,
    'kernels.metadata:compressor_metadata:name:int64->int32#2': DTYPE,
    'kernels.metadata:paged_slots:binop:(req < 0) | (req >= block_table.shape[0])[BitOr]->BitAnd#0': UNREACHABLE,
    'kernels.metadata:paged_slots:binop:positions + 1[Add]->Sub#0': RATIO,
    'kernels.metadata:paged_slots:boolop:block_size <= 0 or divisor <= 0[Or]->And#0': UNREACHABLE,
    'kernels.metadata:paged_slots:cmp:block_size <= 0[LtE]->Lt#0': UNREACHABLE,
    'kernels.metadata:paged_slots:cmp:divisor <= 0[LtE]->Lt#0': UNREACHABLE,
    'kernels.metadata:paged_slots:cmp:req >= block_table.shape[0][GtE]->Gt#0': UNREACHABLE,
    'kernels.metadata:paged_slots:const:0->1#0': UNREACHABLE,
    'kernels.metadata:paged_slots:const:False->True#0': ONLY_COMPLETE,
    'kernels.metadata:paged_slots:drop-call:positions.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.metadata:paged_slots:drop-call:request_ids.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.metadata:paged_slots:name:any->all#1': UNREACHABLE,
    'kernels.metadata:paged_slots:name:int64->int32#1': DTYPE,
    'kernels.metadata:window_metadata:const:0->1#0': WINDOW_POS,
    'kernels.metadata:window_metadata:drop-call:indices.to(torch.int32)[to]->(skipped)#0': PAD_CAST,
    'kernels.metadata:window_metadata:drop-call:lens.to(torch.int32)[to]->(skipped)#0': PAD_CAST,
    'kernels.metadata:window_metadata:drop-call:torch.minimum(positions + 1, torch.full_like(positions, w...[clamp_min]->(skipped)#0': WINDOW_POS,
    'kernels.metadata:window_metadata:drop-unary:-1[USub]->(none)#0': DIM,
    'kernels.metadata:window_metadata:drop-unary:-1[USub]->(none)#1': DIM,
    'kernels.metadata:window_metadata:drop-unary:-1[USub]->(none)#3': DIM,
    'kernels.metadata:window_metadata:name:int32->int64#0': PAD_CAST,
    'kernels.metadata:window_metadata:name:int32->int64#1': PAD_CAST,
    'kernels.quant:<module>:const:36->37#0': LUT,
    'kernels.quant:QuantRule:const:127->128#0': FLOOR128,
    'kernels.reference.mhc:identity_pre_mix:name:float32->bfloat16#0':
        "identity_pre_mix is reached through causal_encoder only, which hands it to hc_pre: a one-hot is exact in "
        "BF16 and hc_pre computes in FP32 (the FP32 ABI of the mix itself is pinned on the function directly by "
        "contracts/test_mhc.py).",
    'kernels.reference.mhc:identity_pre_mix:const:1.0->2.0#0':
        "Through causal_encoder a one-hot of 2.0 doubles the first layer's collapse, exactly (a power of two in BF16 "
        "and FP32), and the attention half-layer RMS-normalises its projections, so no output of the chain moves "
        "(measured: it survives every Block contract); the one-hot of 1.0 is pinned on the function directly by "
        "contracts/test_mhc.py.",
    'kernels.v4.prefill_compressor:rope_half_rows:const:0->1#0':
        "rope_head_dim <= 1 instead of <= 0: the only value between is 1, which the odd check refuses the same way.",
    'kernels.quant:_ceil_pow2_exponent:drop-call:exp.to(torch.int64)[to]->(skipped)#0': CASTNOOP,
    'kernels.quant:_ceil_pow2_exponent:drop-call:v.to(torch.float32).view(torch.int32).to(torch.int64)[to]->(skipped)#0': CASTNOOP,
    'kernels.quant:_ceil_pow2_exponent:drop-call:v.to(torch.float32)[to]->(skipped)#0': CASTNOOP,
    'kernels.quant:_ceil_pow2_exponent:drop-call:v.to(torch.float32)[to]->(skipped)#1': CASTNOOP,
    'kernels.quant:_ceil_pow2_exponent:name:int64->int32#0': CASTNOOP,
    'kernels.quant:_ceil_pow2_exponent:name:int64->int32#1': CASTNOOP,
    'kernels.quant:_ceil_pow2_exponent:name:int64->int32#2': CASTNOOP,
    'kernels.quant:_ceil_pow2_exponent:name:int64->int32#3': CASTNOOP,
    'kernels.quant:_ceil_pow2_exponent:drop-call:v.to(torch.float32)[to]->(skipped)#2': CASTNOOP,
    'kernels.quant:_ceil_pow2_exponent:drop-call:torch.ceil(torch.log2(v.to(torch.float32))).to(torch.int64)[to]->(skipped)#0':
        "The log2 ceiling left as an integral FP32 tensor: every use (the clamp, the comparison with -126, the +127 "
        "cast to uint8, the shift cast to int32) gives the same values.",
    'kernels.quant:_e2m1_pack:cmp:sign_of is None[Is]->IsNot#0': PACK,
    'kernels.quant:_e2m1_pack:drop-call:torch.eq(quad, j).to(j.dtype)[to]->(skipped)#0': PACK,
    'kernels.quant:_e2m1_pack:drop-call:y4.clone()[clone]->(skipped)#0': PACK,
    'kernels.quant:_e2m1_pack:name:int32->int64#0': PACK,
    'kernels.quant:_e2m1_pack:name:int32->int64#1': PACK,
    'kernels.quant:_fp4_luts:const:0->1#1': LUT,
    'kernels.quant:_fp4_luts:name:int32->int64#0': LUT,
    'kernels.quant:_groups:cmp:x.dtype not in (torch.bfloat16, torch.float16, torch.floa...[NotIn]->In#0': GROUPS_CAST,
    'kernels.quant:_groups:drop-call:x.to(torch.float32)[to]->(skipped)#0': GROUPS_CAST,
    'kernels.quant:_groups:name:bfloat16->float32#2': GROUPS_CAST,
    'kernels.quant:_groups:name:float16->bfloat16#0': GROUPS_CAST,
    'kernels.quant:_groups:name:float32->bfloat16#0': GROUPS_CAST,
    'kernels.quant:_quantize_rows:binop:amax / r.qmax[Div]->Mult#2': CLAMP_PASS,
    'kernels.quant:_quantize_rows:binop:k * r.qmax * unclamped / stored.to(torch.float32)[Div]->Mult#0': CLAMP_PASS,
    'kernels.quant:_quantize_rows:cmp:k * r.qmax * unclamped / stored.to(torch.float32) > J_MAX[Gt]->GtE#0': CLAMP_PASS,
    "kernels.quant:_quantize_rows:cmp:r.fmt != 'mxfp4'[NotEq]->Eq#0": CLAMP_PASS,
    'kernels.quant:_quantize_rows:cmp:y.dtype != torch.float32[NotEq]->Eq#0': Y_FP32,
    'kernels.quant:_quantize_rows:const:1.0->2.0#0': K_UNUSED,
    'kernels.quant:_quantize_rows:const:127->128#0': EXPCLAMP,
    'kernels.quant:_quantize_rows:const:127->128#1': EXPCLAMP,
    'kernels.quant:_quantize_rows:drop-call:(amax / r.qmax).clamp_min(r.scale_floor).clamp(max=r.e4m3...[clamp]->(skipped)#0': SATURATE,
    'kernels.quant:_quantize_rows:drop-call:(amax / r.qmax).clamp_min(r.scale_floor)[clamp_min]->(skipped)#1': CLAMP_PASS,
    'kernels.quant:_quantize_rows:drop-call:(shift - exp).to(torch.int32)[to]->(skipped)#0': BITS,
    'kernels.quant:_quantize_rows:drop-call:_ceil_pow2_exponent(raw, r.pow2).clamp(-127, 127)[clamp]->(skipped)#0': EXPCLAMP,
    'kernels.quant:_quantize_rows:drop-call:bits.to(torch.int32)[to]->(skipped)#0': BITS,
    'kernels.quant:_quantize_rows:drop-call:payload.contiguous()[contiguous]->(skipped)#0': CONTIG,
    'kernels.quant:_quantize_rows:drop-call:scale.contiguous()[contiguous]->(skipped)#0': CONTIG,
    'kernels.quant:_quantize_rows:drop-call:torch.where(poisoned, E8M0_NAN, scale_code).to(torch.uint8)[to]->(skipped)#0': BITS,
    'kernels.quant:_quantize_rows:drop-call:y.float()[float]->(skipped)#0': Y_FP32,
    'kernels.quant:_quantize_rows:drop-unary:-126[USub]->(none)#0': SHIFT,
    'kernels.quant:_quantize_rows:name:float32->bfloat16#0': FLOOR_BF16,
    'kernels.quant:_quantize_rows:name:float32->bfloat16#1': E4M3_BF16,
    'kernels.quant:_quantize_rows:name:float32->bfloat16#2': CLAMP_PASS,
    'kernels.quant:_quantize_rows:name:float32->bfloat16#3': Y_FP32,
    'kernels.quant:_quantize_rows:name:int32->int64#0': BITS,
    'kernels.quant:_quantize_rows:name:int32->int64#1': BITS,
    'kernels.quant:_quantize_rows:name:uint8->int8#1': BITS,
    'kernels.quant:_quantize_rows:name:uint8->int8#2': BITS,
    'kernels.quant:_quantize_rows:name:uint8->int8#3': BITS,
    'kernels.quant:_quantize_rows:name:uint8->int8#4': BITS,
    'kernels.quant:_quantize_rows:name:uint8->int8#5': BITS,
    'kernels.quant:e2m1_decode:name:float32->bfloat16#0': E2M1_TABLE,
    'kernels.quant:e2m1_encode:const:1->2#0': LUT,
    'kernels.quant:e2m1_encode:const:6.0->12.0#0': LUT,
    'kernels.quant:e2m1_encode:const:True->False#0': LUT,
    'kernels.quant:e2m1_encode:drop-call:(code | torch.signbit(v).to(code.dtype) << 3).to(torch.ui...[to]->(skipped)#0': LUT,
    'kernels.quant:e2m1_encode:drop-call:(on_mid & (code % 2 == 1)).to(code.dtype)[to]->(skipped)#0': LUT,
    'kernels.quant:e2m1_encode:drop-call:normalized.to(torch.float32)[to]->(skipped)#0': LUT,
    'kernels.quant:e2m1_encode:drop-call:torch.signbit(v).to(code.dtype)[to]->(skipped)#0': LUT,
    'kernels.quant:e2m1_encode:drop-call:v.abs().clamp(max=6.0)[clamp]->(skipped)#0': LUT,
    'kernels.quant:e2m1_encode:name:float32->bfloat16#0': LUT,
    'kernels.quant:e2m1_encode:name:float32->bfloat16#1': LUT,
    'kernels.quant:e2m1_encode:name:uint8->int8#0': LUT,
    'kernels.quant:e8m0_decode:binop:c - 127[Sub]->Add#0': HOST_E8M0,
    'kernels.quant:e8m0_decode:cmp:c == E8M0_NAN[Eq]->NotEq#0': HOST_E8M0,
    'kernels.quant:e8m0_decode:cmp:code.dtype != torch.uint8[NotEq]->Eq#0': HOST_E8M0,
    'kernels.quant:e8m0_decode:const:127->128#0': HOST_E8M0,
    'kernels.quant:e8m0_decode:const:False->True#0': HOST_E8M0,
    'kernels.quant:e8m0_decode:drop-call:code.view(torch.uint8).to(torch.int32)[to]->(skipped)#0': HOST_E8M0,
    'kernels.quant:e8m0_decode:name:float32->bfloat16#1': HOST_E8M0,
    'kernels.quant:e8m0_decode:name:int32->int64#0': HOST_E8M0,
    'kernels.quant:e8m0_decode:name:uint8->int8#0': HOST_E8M0,
    'kernels.quant:e8m0_decode:name:uint8->int8#1': HOST_E8M0,
    'kernels.quant:mx_dequantize:name:uint8->int8#0': BITS,
    'kernels.quant:mx_quantize:binop:2 * per_block[Mult]->Div#0': BLOCKING,
    'kernels.quant:mx_quantize:cmp:rows.shape[0] < 2 * per_block[Lt]->LtE#0': BLOCKING,
    'kernels.quant:mx_quantize:const:0->1#1': BLOCKING,
    'kernels.quant:mx_quantize:const:1->2#2': BLOCKING,
    'kernels.quant:mx_quantize:const:1->2#3': BLOCKING,
    'kernels.quant:mx_quantize:const:2->3#0': BLOCKING,
    'kernels.quant:mx_quantize:name:max->min#0': BLOCKING,
    'kernels.quant:scale_values:const:True->False#0': HOST_E8M0,
    'kernels.quant:scale_values:name:uint8->int8#0': BITS,
    'kernels.quant:unpack_fp4:drop-call:packed.to(torch.uint8)[to]->(skipped)#0': UNPACK,
    'kernels.quant:unpack_fp4:name:uint8->int8#0': UNPACK,
    'kernels.reference.compressor:compressor_ratio2:cmp:start >= end[GtE]->Gt#0': EMPTY_REQ,
    'kernels.reference.compressor:compressor_ratio2:drop-call:state_cache.clone()[clone]->(skipped)#0': INPLACE,
    'kernels.reference.compressor:rms_norm:const:1e-20->2e-20#0': EPS_DEFAULT,
    'kernels.reference.compressor:rms_norm:drop-call:weight.float()[float]->(skipped)#0': NORM_FP32,
    'kernels.reference.indexer:logical_to_physical:drop-call:block_table.to(torch.long)[to]->(skipped)#0': DTYPE,
    'kernels.reference.indexer:logical_to_physical:drop-call:request_ids.to(torch.long)[to]->(skipped)#0': DTYPE,
    'kernels.reference.indexer:logical_to_physical:drop-unary:-1[USub]->(none)#0': DIM,
    'kernels.reference.indexer:index_scores:boolop:width == 0 or tokens == 0[Or]->And#0': EMPTY_SCORES,
    'kernels.reference.indexer:index_scores:const:0->1#6': MASKED_ROWS,
    'kernels.reference.indexer:index_scores:drop-call:compressed_lens.to(torch.long)[to]->(skipped)#0': DTYPE,
    'kernels.reference.indexer:index_scores:drop-call:head_weights.float()[float]->(skipped)#0': TORCH_F64,
    'kernels.reference.indexer:index_scores:drop-call:keys.float()[float]->(skipped)#0': TORCH_F64,
    'kernels.reference.indexer:index_scores:drop-call:q.float()[float]->(skipped)#0': TORCH_F64,
    "kernels.reference.indexer:index_scores:drop-call:torch.einsum('thd,tld->thl', _bf16(q.float()).double(), k...[float]->(skipped)#0": TORCH_F64,
    'kernels.reference.indexer:index_scores:drop-call:weighted.double().sum(1).float()[float]->(skipped)#0': TORCH_F64,
    'kernels.reference.indexer:index_scores:drop-unary:-1[USub]->(none)#0': DIM,
    'kernels.reference.indexer:candidate_blocks:binop:nblocks - 1[Sub]->Add#0': LASTCLAMP,
    'kernels.reference.indexer:candidate_blocks:const:0->1#0': HAS1,
    'kernels.reference.indexer:candidate_blocks:const:0->1#1': LASTMIN,
    'kernels.reference.indexer:candidate_blocks:const:0->1#2': NBLOCKS0,
    'kernels.reference.indexer:candidate_blocks:const:True->False#1': ZIP,
    'kernels.reference.indexer:candidate_blocks:drop-call:(lens - 1).clamp_min(0)[clamp_min]->(skipped)#0': LASTMIN,
    'kernels.reference.indexer:candidate_blocks:drop-call:best.clone()[clone]->(skipped)#0': ALIAS,
    'kernels.reference.indexer:candidate_blocks:drop-call:compressed_lens.to(torch.long)[to]->(skipped)#0': DTYPE,
    "kernels.reference.indexer:candidate_blocks:drop-call:torch.div((lens - 1).clamp_min(0), block, rounding_mode='...[clamp]->(skipped)#0": LASTCLAMP,
    'kernels.reference.indexer:candidate_blocks:drop-unary:-1[USub]->(none)#0': DIM,
    'kernels.reference.indexer:candidate_blocks:drop-unary:-1[USub]->(none)#2': DIM,
    'kernels.reference.indexer:candidate_blocks:name:uint8->int8#0': U8OUT,
    'kernels.reference.indexer:select_topk:boolop:k == 0 or tokens == 0[Or]->And#0': EMPTY_SCORES,
    'kernels.reference.indexer:select_topk:drop-call:rows.to(torch.int32)[to]->(skipped)#0': DTYPE,
    'kernels.reference.indexer:select_topk:drop-unary:-1[USub]->(none)#1': DIM,
    'kernels.reference.indexer:select_topk:drop-unary:-1[USub]->(none)#2': DIM,
    'kernels.reference.indexer:select_topk:drop-unary:-1[USub]->(none)#3': DIM,
    'kernels.reference.indexer:select_topk:name:int32->int64#1': DTYPE,
    'kernels.reference.rope:materialize_rope_rows:drop-call:position_ids[:num_tokens].to(torch.int64)[to]->(skipped)#0': ROPE_CAST,
    'kernels.reference.rope:materialize_rope_rows:drop-unary:-1[USub]->(none)#0': DIM,
    'kernels.reference.rope:materialize_rope_rows:name:int64->int32#0': ROPE_CAST,
    'kernels.reference.rope:check_rope_rows:drop-call:position_ids[:num_tokens].to(torch.int64)[to]->(skipped)#0': ROPE_CAST,
    'kernels.reference.rope:check_rope_rows:name:int64->int32#1': ROPE_CAST,
    'kernels.sequence_parallel:check_owner_slabs:cmp:b.width > b.count[Gt]->GtE#0': EMPTY_PAD,
    'kernels.sequence_parallel:check_owner_slabs:const:0->1#2': EMPTY_PAD,
    'kernels.sequence_parallel:check_owner_slabs:const:True->False#0': ZIP,
    'kernels.sequence_parallel:check_owner_slabs:drop-call:slab.valid.to(torch.bool)[to]->(skipped)#0': VALID_BOOL,
    'kernels.sequence_parallel:check_owner_slabs:drop-call:slab.valid.to(torch.bool)[to]->(skipped)#1': VALID_BOOL,
    'kernels.sequence_parallel:sp_gather:const:True->False#0': ZIP,
    'kernels.sequence_parallel:sp_gather:const:True->False#1': ZIP,
    'kernels.sequence_parallel:sp_gather:const:True->False#2': ZIP,
    'kernels.sequence_parallel:sp_shard:drop-call:positions[rows].to(torch.int32)[to]->(skipped)#0': SLAB_CAST,
    'kernels.sequence_parallel:sp_shard:drop-call:token_ids[rows].to(torch.int32)[to]->(skipped)#0': SLAB_CAST,
    'kernels.sequence_parallel:sp_shard:name:int32->int64#2': SLAB_CAST,
    'kernels.sequence_parallel:sp_shard:name:int32->int64#3': SLAB_CAST,
    'kernels.reference.attention:_check_indices:drop-call:indices.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.reference.attention:_gather:drop-call:indices[valid].to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.reference.attention:_check_indices:name:int64->int32#1': DTYPE,
    'kernels.reference.attention:_gather:name:int64->int32#0': DTYPE,
    'kernels.reference.attention:sparse_attention:drop-call:sink.to(torch.float64)[to]->(skipped)#0': SINK_FP32,
    'kernels.reference.attention:sparse_attention:name:float64->float32#1': SINK_FP32,
    'kernels.half_layer:half_layer_call:const:1->2#1': TP_DEFAULT,
    'kernels.reference.o_proj:o_proj:const:1->2#1': HALF_SENTINEL,
    'kernels.reference.o_proj:o_proj:drop-unary:-1[USub]->(none)#1': HALF_SENTINEL,
    'kernels.reference.o_proj:o_proj:drop-unary:-1[USub]->(none)#0': DIM,
    "kernels.reference.o_proj:o_proj:drop-call:torch.einsum('tgk,gnk->tgn', x, wo_a.to(torch.float64)).t...[to]->(skipped)#1": TORCH_F64,
    'kernels.reference.o_proj:o_proj:name:float32->bfloat16#0': TORCH_FP64_BF16,
    'kernels.v4.compressor:v4_publish_compressed:const:1->2#4': V4_ONE_ROW_SLICE,
    'kernels.reference.attention_layer:_compressed_part:const:1->2#0': NEG_SLOT,
    'kernels.reference.rope:check_rope_rows:cmp:freqs_cos.dtype != dtype[NotEq]->Eq#0': BINDING_DTYPE,
    'kernels.reference.o_proj:o_proj:binop:heads * dim // wo_a.shape[0][FloorDiv]->Div#0': INT_FLOAT,
    'kernels.reference.rope:rope_interleave:drop-call:x[..., -width:].float()[float]->(skipped)#0': FP32_TABLES,
    'kernels.reference.rope:rope_interleave:drop-call:head.float()[float]->(skipped)#0': FP32_TABLES,
    'kernels.reference.attention_layer:_rows:name:bfloat16->float32#0': MX_EXACT_BF16,
    'kernels.reference.attention_layer:attention_half_layer:name:int32->int64#0': SWA_NO_COMPRESSED,
    'kernels.reference.attention_layer:attention_half_layer:name:bfloat16->float32#2': SWA_NO_COMPRESSED,
    'kernels.reference.attention_layer:_compressed_part:cmp:ratio == 2[Eq]->NotEq#0': R1_R2_LAYOUT,
    'kernels.reference.attention_layer:_compressed_part:const:2->3#0': R1_R2_LAYOUT,
    "kernels.reference.attention_layer:_compressed_part:drop-call:inputs['compressed_slots'][:active]"
    ".masked_fill(~publish,...[masked_fill]->(skipped)#0": PREMASKED_SLOTS,
    'kernels.cache:layouts:const:2->3#0': LAYOUT_UNUSED,
    'kernels.cache:layouts:const:1->2#0': LAYOUT_UNUSED,
    'kernels.cache:layouts:const:2->3#2': LAYOUT_UNUSED,
    'kernels.cache:layouts:const:2->3#5': LAYOUT_UNUSED,
    'kernels.cache:layouts:const:2->3#6': LAYOUT_UNUSED,
    'kernels.cache:layouts:const:0->1#0': LAYOUT_UNUSED,
    'kernels.cache:layouts:binop:2 * d[Mult]->Div#0': LAYOUT_UNUSED,
    'kernels.cache:layouts:binop:2 * d[Mult]->Div#1': LAYOUT_UNUSED,
    'kernels.cache:layouts:name:float32->bfloat16#0': LAYOUT_UNUSED,
    'kernels.cache:layouts:binop:d // 2[FloorDiv]->Div#0': INT_FLOAT,
    'kernels.cache:layouts:binop:d // 2[FloorDiv]->Div#1': INT_FLOAT,
    'kernels.cache:layouts:binop:di // 2[FloorDiv]->Div#0': INT_FLOAT,
    'kernels.reference.compressor:compressor_ratio1:const:1e-20->2e-20#0': EPS_PASSED,
    'kernels.reference.compressor:publish_compressed:const:1e-20->2e-20#0': EPS_PASSED,
    'kernels.reference.compressor:publish_compressed:drop-call:value.float()[float]->(skipped)#0': GROUPS_CAST,
    'kernels.reference.compressor:publish_compressed:drop-call:key.float()[float]->(skipped)#0': GROUPS_CAST,
    'kernels.reference.indexer:index_head_weights:drop-call:(x.double() @ weights_proj.double()).float()[float]->(skipped)#0': TORCH_FP64_BF16,
    'kernels.reference.indexer:index_head_weights:binop:w * dim ** (-0.5)[Mult]->Div#0': TOPK_SCALE,
    'kernels.reference.indexer:index_head_weights:binop:w * dim ** (-0.5) * heads ** (-0.5)[Mult]->Div#0': TOPK_SCALE,
    'kernels.reference.indexer:index_head_weights:drop-unary:-0.5[USub]->(none)#0': TOPK_SCALE,
    'kernels.reference.indexer:index_head_weights:drop-unary:-0.5[USub]->(none)#1': TOPK_SCALE,
    'contracts.checks.precision:_native_rows:cmp:t.ndim <= 1[LtE]->Lt#0': ROWS1D,
    'contracts.checks.precision:<module>:const:1->2#0': ROW_BLOCKS,
    'contracts.checks.precision:<module>:binop:1 << 20[LShift]->RShift#0': ROW_BLOCKS,
    'contracts.checks.precision:<module>:const:20->21#0': ROW_BLOCKS,
    'contracts.checks.precision:_row_stats:const:0->1#0': ROW_BLOCKS,
    'contracts.checks.precision:_row_stats:const:1->2#0': ROW_BLOCKS,
    'contracts.checks.precision:_row_stats:const:1->2#2': ROW_BLOCKS,
    'contracts.checks.precision:_row_stats:name:max->min#0': ROW_BLOCKS,
    'contracts.checks.precision:_row_stats:name:max->min#1': ROW_BLOCKS,
    'contracts.checks.precision:_row_stats:cmp:rows <= step[LtE]->Lt#0': ROW_BLOCKS,
    'contracts.checks.precision:_exact_row_stats:drop-call:(a - e).nan_to_num(nan=math.inf, posinf=math.inf, neginf=...[nan_to_num]->(skipped)#0': NAN_DIFF,
    'contracts.checks.precision:_exact_row_stats:const:0.0->1.0#0': REF_RMS_NAN,
    'contracts.checks.precision:_exact_row_stats:const:0.0->1.0#1': REF_RMS_NAN,
    'contracts.checks.precision:_exact_row_stats:const:0.0->1.0#2': REF_RMS_NAN,
    'contracts.checks.precision:_exact_row_stats:drop-call:e.nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)[nan_to_num]->(skipped)#0': REF_RMS_NAN,
    'contracts.checks.precision:_exact_row_stats:drop-call:a.to(torch.float64)[to]->(skipped)#0': PROMOTE,
    'contracts.checks.precision:_fp32_row_stats:binop:torch.linalg.vector_norm(diff, dim=1) / root_n[Div]->Mult#0': RECHECK_MORE,
    'contracts.checks.precision:_fp32_margin:const:4.0->8.0#0': RECHECK_MORE,
    'contracts.checks.precision:_fp32_margin:const:3->4#0': RECHECK_MORE,
    'contracts.checks.precision:_fp32_margin:drop-unary:-24[USub]->(none)#0': RECHECK_MORE,
    'contracts.checks.precision:_fp32_margin:binop:4.0 * (width + 3) * 2.0 ** (-24)[Mult]->Div#0': MARGIN,
    'contracts.checks.precision:_fp32_margin:const:24->25#0': MARGIN,
    'contracts.checks.precision:_fp32_margin:binop:width + 3[Add]->Sub#0': MARGIN,
    'contracts.checks.precision:check_row_precision:cmp:a.dtype == torch.float64[Eq]->NotEq#0': FP64_ROUTE,
    'contracts.checks.precision:check_row_precision:cmp:e.dtype == torch.float64[Eq]->NotEq#0': FP64_ROUTE,
    'contracts.checks.precision:check_row_precision:boolop:a.dtype == torch.float64 or e.dtype == torch.float64[Or]->And#0': FP64_ROUTE,
    'contracts.checks.precision:check_row_precision:name:float64->float32#0': FP64_ROUTE,
    'contracts.checks.precision:check_row_precision:name:float64->float32#1': FP64_ROUTE,
    'contracts.checks.precision:check_row_precision:cmp:excess < 1.0 - _fp32_margin(a.shape[1])[Lt]->LtE#0': EXCESS_TIE,
    'contracts.checks.precision:check_row_precision:name:float64->float32#2': MSG_CAST,
    'contracts.checks.precision:check_row_precision:name:float64->float32#3': MSG_CAST,
    'contracts.checks.precision:check_row_precision:name:float64->float32#4': MSG_CAST,
    'contracts.checks.precision:check_row_precision:name:float64->float32#5': MSG_CAST,
    'contracts.checks.precision:check_row_precision:drop-call:a[row].to(torch.float64)[to]->(skipped)#0': MSG_CAST,
    'contracts.checks.precision:check_row_precision:drop-call:e[row].to(torch.float64)[to]->(skipped)#0': MSG_CAST,
    'contracts.checks.precision:check_row_precision:drop-call:a[row].to(torch.float64)[to]->(skipped)#1': MSG_CAST,
    'contracts.checks.precision:check_row_precision:drop-call:e[row].to(torch.float64)[to]->(skipped)#1': MSG_CAST,
    'contracts.checks.precision:check_row_precision:const:1.0->2.0#1': MASK_GOOD,
    'contracts.checks.precision:check_row_precision:cmp:rms_excess[k] >= peak_excess[k][GtE]->Gt#0': TIE_CLAUSE,
    'contracts.checks.precision:_fp32_row_stats:drop-call:a.to(torch.float32)[to]->(skipped)#0': PROMOTE,
    'kernels.reference.attention_layer:attention_half_layer:const:1->2#3': SWA_NO_COMPRESSED,
    'kernels.reference.attention_layer:attention_half_layer:const:1->2#5': SWA_NO_COMPRESSED,
    'kernels.reference.attention_layer:attention_half_layer:const:1->2#6': PREMASKED_SLOTS,
    'kernels.reference.indexer:index_head_weights:const:0.5->1.0#1': SCALE_NEAR_TIES,
    'kernels.reference.mhc:hc_mixes:drop-call:scale.float()[float]->(skipped)#0': PROMOTE,
    'kernels.reference.mhc:hc_mixes:drop-call:base.float()[float]->(skipped)#0': PROMOTE,
    'kernels.reference.mhc:hc_pre:drop-call:pre_mix.float()[float]->(skipped)#0': PROMOTE,
    'kernels.reference.mhc:hc_pre:drop-call:x_hc.float()[float]->(skipped)#0': PROMOTE,
    'kernels.reference.mhc:hc_post:drop-call:sublayer.float()[float]->(skipped)#0': PROMOTE,
    'kernels.reference.mhc:hc_post:drop-call:residual_mix.float()[float]->(skipped)#0': PROMOTE,
    'kernels.reference.mhc:hc_post:drop-call:post_mix.float()[float]->(skipped)#0': PROMOTE,
    'kernels.reference.moe:moe_gate:drop-call:bias.float()[float]->(skipped)#0': PROMOTE,
    'kernels.reference.moe:moe_expert:drop-call:route_weight.float()[float]->(skipped)#0': PROMOTE,
    'kernels.reference.moe:moe_ep:drop-call:gates[src][0][t, k].float()[float]->(skipped)#0': PROMOTE,
    'kernels.reference.mhc:hc_mixes:drop-call:(torch.arange(tokens) < active).to(torch.float32)[to]->(skipped)#0': MASK01,
    'kernels.reference.mhc:hc_mixes:name:float32->bfloat16#0': MASK01,
    'kernels.reference.mhc:hc_head:drop-call:hc_pre(x_hc, pre_mix).to(torch.bfloat16)[to]->(skipped)#0': CASTNOOP,
    'kernels.reference.moe:moe_ep:drop-call:total.to(torch.bfloat16)[to]->(skipped)#0': CASTNOOP,
    'kernels.reference.moe:moe_ep:name:bfloat16->float32#1': CASTNOOP,
    'kernels.reference.lm_head:embed_pack:drop-call:ids.to(torch.long)[to]->(skipped)#0': CASTNOOP,
    'kernels.reference.moe:moe_gate:drop-unary:-1[USub]->(none)#0': DIM,
    'kernels.reference.moe:moe_gate:drop-unary:-1[USub]->(none)#1': DIM,
    'kernels.reference.moe:moe_gate:drop-unary:-1[USub]->(none)#2': DIM,
    'kernels.reference.moe:moe_gate:drop-unary:-1[USub]->(none)#3': DIM,
    'kernels.reference.mhc:hc_mixes:drop-unary:-1[USub]->(none)#0': DIM,
    'kernels.reference.moe:moe_gate:binop:chosen.sum(dim=-1, keepdim=True) + 1e-20[Add]->Sub#0': EPS_ROUTER,
    'kernels.reference.moe:moe_gate:const:1e-20->2e-20#0': EPS_ROUTER,
    'kernels.reference.moe:moe_gate:const:True->False#0': STABLE_TIES,
    'kernels.reference.moe:moe_ep:const:True->False#0': ZIP,
    'kernels.reference.lm_head:embed_pack:drop-call:rows.unsqueeze(1).expand(-1, config.hc_mult, -1).contiguo...[contiguous]->(skipped)#0': VIEW,
    'kernels.reference.lm_head:lm_head_layout:const:1->2#0': DEFAULT_DP,
    'kernels.prefill_plan:decoder_replay:name:int64->int32#0': DTYPE,
    'kernels.prefill_plan:decoder_replay:name:int64->int32#1': DTYPE,
    'kernels.prefill_plan:decoder_replay:name:int64->int32#2': DTYPE,
    'kernels.prefill_plan:decoder_replay:name:int64->int32#3': DTYPE,
    'kernels.half_layer:half_layer_call:const:1->2#2': DEFAULT_EPOCH,
    'kernels.reference.engram:engram_tp:drop-call:torch.stack(partials).float()[float]->(skipped)#0': ENGRAM_EXACT_SUM,
    'kernels.reference.engram:_gate_and_add:drop-call:(lookup.to(torch.bfloat16).double() @ wkv.to(torch.bfloat...[float]->(skipped)#0': ENGRAM_KV_FP64,
    'kernels.reference.engram:_gate_and_add:drop-unary:-1[USub]->(none)#0': ENGRAM_UNFLATTEN,
    'kernels.reference.engram:_gate_and_add:drop-call:weight.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.reference.engram:engram_tp:drop-call:mine[..., None].to(shard.dtype)[to]->(skipped)#0': ENGRAM_MASK_CAST,
    'kernels.reference.block:_block:const:0->1#1': REPLICAS,
    'kernels.reference.block:decode_block_sharded:const:0->1#1': SAME_WIDTH,
    'kernels.reference.block:decode_block_sharded:const:True->False#0': SAME_LENGTH,
    'kernels.reference.moe:moe_ep:const:0->1#5': ONE_INPUT,
    'kernels.reference.moe:moe_ep:const:0->1#6': ONE_INPUT,
    'kernels.reference.moe:moe_ep:drop-call:per_expert[dst].clone()[clone]->(skipped)#0': FRESH_COUNT,
    'kernels.reference.lm_head:final_norm:drop-call:hidden.float()[float]->(skipped)#0': NORM_FP32,
    'kernels.prefill_plan:_spans:drop-call:torch.as_tensor(starts).to(torch.int64)[to]->(skipped)#0': CASTNOOP,
    'kernels.prefill_plan:_encoder_metadata:name:int64->int32#0': DTYPE,
    'kernels.prefill_plan:_encoder_metadata:name:int64->int32#1': DTYPE,
    'kernels.prefill_plan:_cat:const:0->1#0': NONEMPTY_PARTS,
    'kernels.prefill_plan:decoder_replay:name:int64->int32#5': DTYPE,
    'kernels.prefill_plan:encoder_replay:name:int64->int32#0': DTYPE,
    'kernels.prefill_plan:encoder_replay:name:int64->int32#2': DTYPE,
    'kernels.prefill_plan:encoder_replay:name:int64->int32#4': DTYPE,
    'kernels.prefill_plan:_spans:name:int64->int32#0': DTYPE,
    'kernels.prefill_plan:_encoder_metadata:drop-call:torch.as_tensor(kv_seq_lens).to(torch.int64)[to]->(skipped)#0': CASTNOOP,
    'kernels.prefill_plan:_encoder_metadata:drop-call:position_ids[first:last].to(torch.int64)[to]->(skipped)#0': CASTNOOP,
    'kernels.prefill_plan:_cat:drop-call:torch.cat(parts).to(dtype)[to]->(skipped)#0': CASTNOOP,
    'kernels.prefill_plan:decoder_replay:name:int64->int32#4': DTYPE,
    'kernels.prefill_plan:encoder_replay:name:int64->int32#1': DTYPE,
    'kernels.prefill_plan:encoder_replay:name:int64->int32#3': DTYPE,
    'kernels.v4.decode_metadata:_starts:name:int64->int32#0': DTYPE,
    'kernels.v4.decode_metadata:paged_rows:name:int64->int32#0': DTYPE,
    'kernels.v4.decode_metadata:_windows:name:int64->int32#0': DTYPE,
    'kernels.v4.decode_metadata:hca_topk:name:int64->int32#0': DTYPE,
    'kernels.v4.decode_metadata:hca_topk:name:int64->int32#1': DTYPE,
    'kernels.v4.decode_metadata:_starts:drop-call:s.to(torch.int64)[to]->(skipped)#0': CASTNOOP,
    'kernels.v4.decode_metadata:paged_rows:drop-call:table.to(torch.int64)[to]->(skipped)#0': CASTNOOP,
    'kernels.v4.decode_metadata:_windows:name:int64->int32#1': DTYPE,
    'kernels.v4.decode_metadata:hca_topk:drop-call:position_ids.to(torch.int64)[to]->(skipped)#0': CASTNOOP,
    'kernels.v4.decode_metadata:hca_topk:drop-call:kv_seq_lens.to(torch.int64)[to]->(skipped)#0': CASTNOOP,
    'kernels.v4.compressor:pooled_window:drop-call:weights.norm.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.compressor:_slot:binop:pos // page[FloorDiv]->Div#0': INT_BOUND,
    'kernels.v4.mtp:quantize_rows_int8:drop-call:torch.clamp(torch.round(v * quant), -scale_max, scale_max)[clamp]->(skipped)#0': INT8_CLAMP,
    'kernels.v4.mtp:quantize_rows_int8:drop-call:torch.clamp(torch.round(v * quant), -scale_max, scale_max...[to]->(skipped)#0': CASTNOOP,
    'kernels.v4.mtp:mtp_projection:drop-call:e_smooth.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.mtp:mtp_projection:drop-call:h_smooth.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.mtp:_linear_int8:drop-call:weight_scale.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.mtp:_rms:drop-call:w.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.mtp:mtp_projection:drop-call:(e[:, None, :] + h).to(torch.float32)[to]->(skipped)#0': CASTNOOP,
    'kernels.v4.compressor:v4_publish_compressed:const:1->2#5': FIRST_ROW,
    'kernels.v4.compressor:v4_publish_compressed:drop-call:row[0].to(pool.dtype)[to]->(skipped)#0': CASTNOOP,
    'kernels.v4.index_cache:v4_index_cache_quant:cmp:amax > 0[Gt]->GtE#0': ZERO_SCALE,
    'kernels.v4.index_cache:v4_index_cache_quant:drop-call:x.to(torch.bfloat16).float()[float]->(skipped)#0': POW2_BF16,
    'kernels.v4.index_cache:v4_index_cache_quant:const:1.0->2.0#0': ZERO_ROW_DIVISOR,
    'kernels.v4.sparse_attention:<module>:const:1e+20->2e+20#0': V4_MASK,
    'kernels.v4.sparse_attention:csa_compressed_indices:drop-call:position_ids.reshape(-1).to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.sparse_attention:csa_compressed_indices:name:int64->int32#2': DTYPE,
    'kernels.v4.sparse_attention:csa_compressed_indices:name:int32->int64#1': DTYPE,
    'kernels.v4.sparse_attention:paged_compressed_rows:drop-call:cmp_indices.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.sparse_attention:paged_compressed_rows:name:int64->int32#1': DTYPE,
    'kernels.v4.sparse_attention:v4_sparse_attention:name:float64->float32#2': V4_PROMOTE,
    'kernels.v4.sparse_attention:check_output_projection:binop:rope // 2[FloorDiv]->Div#0': V4_EVEN_ROPE,
    'kernels.v4.sparse_attention:check_output_projection:binop:heads * dim // groups[FloorDiv]->Div#0': V4_GROUP_IN,
    'kernels.v4.qkv_proj:check_v4_qkv_proj_rope:binop:rope // 2[FloorDiv]->Div#0': V4_EVEN_ROPE,
    'kernels.v4.sparse_attention:output_heads:drop-call:freqs_cos[:, :rope // 2].float()[float]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.sparse_attention:output_heads:drop-call:freqs_sin[:, :rope // 2].float()[float]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.heads_projection:group_partials:name:float32->bfloat16#0': V4_PROMOTE,
    'kernels.v4.sparse_attention:csa_compressed_indices:name:int64->int32#0': DTYPE,
    'kernels.v4.sparse_attention:csa_compressed_indices:name:int64->int32#1': DTYPE,
    'kernels.v4.sparse_attention:csa_compressed_indices:drop-call:idx_topk[:, :topk].to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.sparse_attention:csa_compressed_indices:drop-call:torch.where(keep, raw, torch.full_like(raw, -1)).to(torch...[to]->(skipped)#0': DTYPE,
    'kernels.v4.sparse_attention:csa_compressed_indices:const:1->2#4': V4_SENTINEL,
    'kernels.v4.sparse_attention:paged_compressed_rows:name:int64->int32#0': DTYPE,
    'kernels.v4.sparse_attention:paged_compressed_rows:drop-call:cmp_block_table.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.sparse_attention:v4_sparse_attention:drop-unary:-1[USub]->(none)#1': DIM,
    'kernels.v4.sparse_attention:v4_sparse_attention:drop-call:attn_sink.to(torch.float64)[to]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.sparse_attention:output_heads:drop-call:o.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.heads_projection:project_heads:drop-call:wo_b_scale.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.sparse_attention:attention_indices:name:int32->int64#0': DTYPE,
    'kernels.v4.indexer:v4_indexer_query:binop:tokens // seq[FloorDiv]->Div#0': V4_EVEN_ROPE_SHAPE,
    'kernels.v4.indexer:index_query:drop-call:acc.to(torch.float32)[to]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.indexer:index_query:drop-call:qr_scale.float()[float]->(skipped)#0': V4_SCALES_FP32,
    'kernels.v4.indexer:index_query:drop-call:wq_b_scale.float()[float]->(skipped)#0': V4_SCALES_FP32,
    'kernels.v4.indexer:index_query:drop-call:row_cos.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.indexer:index_query:drop-call:row_sin.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.indexer:head_weights:drop-call:(x.double() @ weights_proj.double()).float()[float]->(skipped)#0': V4_WEIGHTS,
    'kernels.v4.indexer:visible_pages:drop-call:pages.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.indexer:visible_pages:name:int64->int32#0': DTYPE,
    'kernels.v4.indexer:score_rows:drop-call:score.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.indexer:score_rows:name:int64->int32#1': DTYPE,
    'kernels.v4.prefill_indexer:prefill_visible:drop-call:position_ids.reshape(-1).to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.prefill_indexer:check_prefill_indexer:binop:rope // 2[FloorDiv]->Div#0': V4_EVEN_ROPE,
    'kernels.v4.prefill_indexer:prefill_visible:name:int64->int32#0': DTYPE,
    'kernels.v4.prefill_indexer:prefill_visible:binop:(pos + 1) // RATIO[FloorDiv]->Div#0': V4_TRUNC,
    'kernels.v4.prefill_compressor:_check:drop-call:position_ids[:num_tokens].to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.prefill_compressor:_check:binop:p // page[FloorDiv]->Div#0': V4_DIV_COMPARE,
    'kernels.v4.prefill_compressor:_check:name:int64->int32#0': DTYPE,
    'kernels.v4.prefill_compressor:_check:const:0->1#3': V4_EMPTY_CHUNK,
    'kernels.v4.prefill_compressor:v4_prefill_compressor:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.prefill_compressor:_chunk_rows:name:int64->int32#0': DTYPE,
    'kernels.v4.prefill_compressor:v4_prefill_index_keys:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.compressor_txn:_check:drop-call:position_ids.reshape(requests, seq).to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.compressor_txn:_check:name:int64->int32#0': DTYPE,
    'kernels.v4.compressor_txn:_check:const:1->2#5': V4_NEG_FIRST,
    'kernels.v4.compressor_txn:v4_compressor_txn:drop-call:weights.norm.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.gate:_check:name:int64->int32#0': DTYPE,
    'kernels.v4.gate:_check:drop-call:tid2eid[ids].to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.gate:v4_gate:drop-call:x_mixed[:coded].float()[float]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.gate:v4_gate:drop-call:norm_w.float()[float]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.gate:v4_gate:drop-unary:-1[USub]->(none)#0': DIM,
    'kernels.v4.gate:v4_gate:drop-call:(xg.double() @ gate_w.double().T).float()[float]->(skipped)#0': V4_LOGITS_FP64,
    'kernels.v4.gate:v4_gate:drop-call:input_ids[:n].to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.gate:v4_gate:name:int64->int32#1': DTYPE,
    'kernels.v4.gate:v4_gate:drop-unary:-1[USub]->(none)#2': DIM,
    'kernels.v4.gate:v4_gate:const:True->False#2': V4_STABLE_CPU,
    'kernels.v4.gate:v4_gate:drop-call:codes.to(torch.int8)[to]->(skipped)#0': CASTNOOP,
    'kernels.v4.gate:v4_gate:name:int32->int64#1': DTYPE,
    'kernels.v4.gate:_check:drop-call:input_ids[:num_tokens].to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.gate:_check:name:int64->int32#1': DTYPE,
    'kernels.v4.gate:v4_gate:drop-unary:-1[USub]->(none)#1': DIM,
    'kernels.v4.gate:v4_gate:drop-call:torch.clamp(torch.round(xg * quant), -config.int8_scale_m...[clamp]->(skipped)#0': V4_CLAMP_NOOP,
    'kernels.v4.gate:v4_gate:drop-call:tid2eid[input_ids[:n].to(torch.int64)].to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.gate:v4_gate:name:int64->int32#0': DTYPE,
    'kernels.v4.gate:v4_gate:drop-call:gate_bias.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.gate:v4_gate:drop-unary:-1[USub]->(none)#3': DIM,
    'kernels.v4.gate:v4_gate:drop-call:routes.to(torch.int32)[to]->(skipped)#0': DTYPE,
    'kernels.v4.gate:v4_gate:drop-call:weights.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.moe:v4_expert:drop-call:x_scale.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.moe:v4_expert:drop-call:weights.w3_scale.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.moe:v4_expert:drop-call:route_weight.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.moe:v4_expert:drop-call:weights.w2_scale.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.moe:v4_moe:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.moe:v4_expert:drop-call:weights.w1_scale.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.moe:v4_moe_stage:const:False->True#0': V4_COMPOSES_DEFAULT,
    'kernels.v4.moe:v4_moe_stage:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.mtp_layer:v4_head_mix:drop-call:scale.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.mtp_layer:v4_head_mix:drop-call:base.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.mtp_layer:v4_mtp_layer:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.mtp_layer:v4_head_mix:drop-call:x_hc.reshape(tokens, hc * dim).float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.mtp_layer:v4_head_mix:drop-unary:-1[USub]->(none)#0': DIM,
    'kernels.v4.moe:v4_moe_ep:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    "kernels.v4.moe:v4_moe_ep:drop-call:expert(gates[src]['x_norm_i8'][:n], gates[src]['x_norm_sc...[float]->(skipped)#0": V4_PROMOTE,
    'kernels.v4.moe:v4_moe_ep:drop-call:torch.stack([back[src, t, j] for t in range(n)]).float()[float]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.moe:v4_moe_ep:name:bfloat16->float32#2': CASTNOOP,
    'kernels.v4.moe:v4_moe_ep:const:True->False#0': ZIP,
    'kernels.v4.moe:v4_moe_ep:drop-call:acc.to(torch.bfloat16)[to]->(skipped)#0': CASTNOOP,
    'kernels.v4.indexer:visible_lengths:name:int64->int32#0': DTYPE,
    'kernels.v4.indexer:visible_lengths:name:int64->int32#1': DTYPE,
    'kernels.v4.indexer:visible_lengths:binop:(pos + 1) // RATIO[FloorDiv]->Div#0': V4_TRUNC,
    'kernels.v4.indexer:v4_indexer_topk:drop-call:(order + offset).to(torch.int32)[to]->(skipped)#0': CASTNOOP,
    'kernels.v4.indexer:v4_indexer_topk:name:int32->int64#1': CASTNOOP,
    'kernels.v4.indexer:v4_indexer_query:binop:rope // 2[FloorDiv]->Div#0': V4_EVEN_ROPE,
    'kernels.v4.indexer:visible_lengths:drop-call:position_ids.reshape(-1).to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.indexer:visible_lengths:drop-call:kv_seq_lens.reshape(-1).to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.indexer:visible_lengths:binop:lens.repeat_interleave(seq) // RATIO[FloorDiv]->Div#0': V4_TRUNC,
    'kernels.v4.sparse_attention:attention_indices:const:1->2#1': V4_PAD_SENTINEL,
    'kernels.v4.index_cache:v4_publish_index_keys:drop-call:rope_cos[start].float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.index_cache:v4_publish_index_keys:drop-call:rope_sin[start].float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.index_cache:v4_publish_index_keys:drop-call:(row.to(torch.bfloat16).double() @ hadamard.double()).flo...[float]->(skipped)#1': V4_BF16_VIA_FP32,
    'kernels.v4.index_cache:v4_publish_index_keys:const:1->2#7': FIRST_ROW,
    'kernels.v4.qkv_proj:_rsqrt_mean_sq:drop-call:(x.double().pow(2).sum(-1, keepdim=True).float() * (1.0 /...[float]->(skipped)#0': V4_FP32_REDUCTION,
    'kernels.v4.qkv_proj:_rsqrt_mean_sq:drop-call:x.double().pow(2).sum(-1, keepdim=True).float()[float]->(skipped)#0': V4_FP32_REDUCTION,
    'kernels.v4.qkv_proj:kv_branch:drop-call:rope_sin[:, :rope // 2].float()[float]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.qkv_proj:kv_branch:drop-call:rope_cos[:, :rope // 2].float()[float]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.qkv_proj:v4_qkv_proj_rope:drop-call:gamma_cq.float()[float]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.qkv_proj:kv_branch:drop-call:gamma_ckv.float()[float]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.qkv_proj:v4_qkv_proj_rope:drop-unary:-1[USub]->(none)#0': DIM,
    'kernels.v4.qkv_proj:kv_branch:drop-unary:-1[USub]->(none)#0': DIM,
    'kernels.v4.qkv_proj:q_before_rounding:drop-call:acc.to(torch.float32)[to]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.qkv_proj:q_before_rounding:drop-call:wq_b_scale.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.qkv_proj:q_before_rounding:drop-call:rope_sin[:, :rope // 2].float()[float]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.qkv_proj:q_before_rounding:drop-call:rope_cos[:, :rope // 2].float()[float]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.attention_stage:stage_positions:name:int64->int32#0': DTYPE,
    'kernels.v4.attention_stage:stage_positions:drop-call:position_ids.reshape(-1).to(torch.int64)[to]->(skipped)#0': DTYPE,
    "kernels.v4.attention_stage:v4_attention_stage:drop-call:proj['kv'][t].to(cache.dtype)[to]->(skipped)#0": CASTNOOP,
    'kernels.v4.attention_stage:v4_attention_stage:const:1->2#3': V4_SWA_PLACEHOLDER,
    'kernels.v4.attention_stage:v4_attention_stage:const:1->2#4': V4_SWA_PLACEHOLDER,
    'kernels.v4.attention_stage:v4_attention_stage:const:1->2#8': V4_SWA_PLACEHOLDER,
    'kernels.v4.attention_stage:v4_attention_stage:name:int32->int64#0': V4_SWA_PLACEHOLDER,
    'kernels.v4.attention_stage:stage_positions:const:0->1#2': V4_PADDING_POSITION,
    'kernels.v4.mtp_layer:v4_prefill_mtp_layer:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.decode_metadata:v4_prefill_swa_indices:name:int64->int32#2': DTYPE,
    'kernels.v4.decode_metadata:v4_prefill_swa_indices:drop-call:position_ids[:num_tokens].to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.compressor_txn:v4_publish_events:const:1->2#10': V4_ONE_ROW_SLICE,
    "kernels.v4.compressor_txn:v4_publish_events:drop-call:rope_interleave(compressed[t:t + 1], cos.float(), sin.flo...[to]->(skipped)#0": CASTNOOP,
    'kernels.v4.compressor_txn:v4_publish_events:drop-call:cos.float()[float]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.compressor_txn:v4_publish_events:drop-call:sin.float()[float]->(skipped)#0': V4_PROMOTE,
    'kernels.v4.mtp:int8_matmul:drop-call:(codes.to(torch.float64) @ weight.to(torch.float64).T).to...[to]->(skipped)#0': V4_INT8_PRODUCT_FP64,
    "kernels.quant:_groups:stage-dtype:bfloat16->float16#2": GROUPS_BF16_TO_FP32,
    "kernels.reference.attention_layer:attention_half_layer:stage-dtype:bfloat16->float16#2": ZERO_PLACEHOLDER,
    "kernels.reference.moe:moe_ep:reorder:for ... in X (accumulating)->for ... in reversed(list(X))#0": COUNT_ORDER,
    "kernels.reference.moe:moe_ep:reorder:for ... in X (accumulating)->for ... in reversed(list(X))#4": ONE_K_PER_EXPERT,
    "kernels.v4.moe:v4_moe_ep:reorder:for ... in X (accumulating)->for ... in reversed(list(X))#2": ONE_K_PER_EXPERT,
    "kernels.metadata:window_metadata:move-clamp:f(x).clamp_min(..)->f(x.clamp_min(..))#0": CLAMP_COMMUTES,
    "kernels.reference.indexer:candidate_blocks:move-clamp:f(x.clamp_min(..))->f(x).clamp_min(..)#0": LASTCLAMP,
    "kernels.v4.compressor_txn:v4_compressor_txn:reorder:for ... in X (accumulating)->for ... in reversed(list(X))#0": PER_TOKEN_ROWS,
    'kernels.v4.input_pack:v4_embed_pack:drop-call:input_ids.to(torch.int64)[to]->(skipped)#0': ("Without the widening "
        "the ids keep their own integer dtype: INT64 ids are unchanged, and INT32 ids hold no value outside INT32, so "
        "the clamp and the row lookup are the same (index_select takes INT32 or INT64)."),
    'kernels.v4.rope_interleave:lane_signs:name:float32->bfloat16#0': '±1 is exact in BF16, and an FP32 table times a BF16 tensor promotes to FP32: the same bytes.',
    'kernels.v4.rope_interleave:v4_rope_interleave:drop-call:sin_signed.contiguous()[contiguous]->(skipped)#0': 'repeat_interleave and the product already return a contiguous tensor.',
    'kernels.v4.rope_interleave:v4_rope_interleave:drop-call:cos_il.contiguous()[contiguous]->(skipped)#0': 'repeat_interleave already returns a contiguous tensor.',
    'kernels.v4.rope_interleave:v4_rope_interleave:binop:sin_half.repeat_interleave(2, dim=1) * lane_signs(2 * sin...[Mult]->Div#0': 'Dividing by ±1 is exact and flips the same sign bit as multiplying by it (±0, ±inf and NaN included).',
    'kernels.v4.cp_zigzag:window_sources:drop-unary:-1[USub]->(none)#1': 'The row of a window source is read only when its segment is >= 0: (-1, 1) is skipped like (-1, -1).',
    'kernels.v4.cp_zigzag:window_sources:const:1->2#0': 'Any negative segment marks a row before the chunk (the caller tests s >= 0): -2 is -1.',
    'kernels.v4.cp_zigzag:window_sources:const:1->2#1': 'The row of a source whose segment is negative is never read: (-1, -2) is (-1, -1).',
    'kernels.v4.cp_zigzag:window_sources:const:True->False#0': 'starts and segment_lens are built to one length: zip(strict=False) pairs them alike.',
    'kernels.v4.cp_zigzag:cp_zigzag_tail_exchange:drop-call:logical.unsqueeze(0).expand(cp, -1, -1).contiguous()[contiguous]->(skipped)#0': 'The expanded view holds the same values on every rank; contiguity is no part of the output.',
    'kernels.v4.cp_zigzag:cp_zigzag_tail_exchange:drop-call:window.unsqueeze(0).expand(cp, -1, -1).contiguous()[contiguous]->(skipped)#0': 'The expanded view holds the same values on every rank; contiguity is no part of the output.',
    'kernels.v4.kv_allgather:check_kv_allgather:binop:GROUP_CAP // tp[FloorDiv]->Div#0': '8192 is divisible by every compiled TP (1, 2, 4): the true quotient is the floor one.',
    'kernels.v4.kv_allgather:prefill_kv_allgather:drop-call:hidden_local.reshape(1, tp * local_t, d).expand(tp, -1, -...[contiguous]->(skipped)#0': 'The expanded view holds the same values on every rank; contiguity is no part of the output.',
    'kernels.v4.markov_head:markov_head:name:int64->int32#0': 'Every id is checked to lie in [0, vocab) first, so its INT32 form is the same index.',
    'kernels.v4.markov_head:markov_head:drop-call:token_ids.to(torch.int64)[to]->(skipped)#0': 'index_select takes INT32 or INT64 indices alike (the ids are 1-D INT32/INT64, checked).',
    'kernels.v4.markov_head:markov_head:drop-call:embed.contiguous()[contiguous]->(skipped)#0': 'index_select already returns a contiguous tensor.',
    'kernels.reference.mhc:hc_pre_fused:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.compressor:v4_compress_and_publish:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.mtp_layer:hc_head_fused:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.sparse_attention:v4_sparse_attention:drop-call:(~valid).to(torch.int8)[to]->(skipped)#0': 'A stable argsort of the boolean mask itself orders the valid keys first in column order, as of its INT8 view.',
    'kernels.v4.cp_swa:ring_rows:name:int64->int32#0': 'Ring rows and positions are far below 2^31: INT32 arithmetic gives the same rows.',
    'kernels.v4.cp_swa:ring_rows:name:int64->int32#1': 'Ring rows and positions are far below 2^31: INT32 arithmetic gives the same rows.',
    'kernels.v4.cp_swa:ring_rows:drop-call:positions.to(torch.int64)[to]->(skipped)#0': 'The positions are integers below 2^31 in any integer dtype: the same rows.',
    'kernels.v4.cp_swa:ring_rows:drop-call:block_table.to(torch.int64)[to]->(skipped)#0': 'The page ids are integers below 2^31 in any integer dtype: the same rows.',
    'kernels.v4.cp_swa:cp_swa_plan:drop-unary:-1[USub]->(none)#0': 'owners is filled for every (rank, part) by the zigzag loop: its initial value is never read.',
    'kernels.v4.cp_swa:cp_swa_plan:const:1->2#0': 'owners is filled for every (rank, part) by the zigzag loop: its initial value is never read.',
    'kernels.v4.cp_swa:cp_swa_plan:drop-unary:-1[USub]->(none)#4': 'preds is written for every (rank, part) before it is returned: its initial value is never read.',
    'kernels.v4.cp_swa:cp_swa_plan:const:1->2#4': 'preds is written for every (rank, part) before it is returned: its initial value is never read.',
    'kernels.v4.cp_swa:cp_swa_plan:name:int64->int32#0': 'The lowered rows are far below 2^31 and are stored into an INT32 table either way.',
    'kernels.v4.cp_swa:cp_swa_plan:name:int32->int64#6': 'Assigning into the INT32 swa table converts either way.',
    'kernels.v4.cp_swa:cp_swa_plan:drop-call:row.to(torch.int32)[to]->(skipped)#0': 'Assigning into the INT32 swa table converts either way.',
    'kernels.v4.cp_swa:cp_swa_plan:cmp:key < prefix[Lt]->LtE#0': "The key at the prefix is the chunk's first position: its own tile (segment 0) or tile 1's pred overlay overrides the ring row, and no later segment's window reaches it (span >= R).",
    'kernels.v4.cp_swa:cp_swa_plan:cmp:key >= pred_start[GtE]->Gt#0': "No window reaches the pred source's first position: a tile-0 window starts after cur - R >= pred_start (span >= R), a tile-1 window after the segment's start.",
    'kernels.v4.cp_swa:cp_swa_plan:const:True->False#0': 'final and slots have one length by construction: zip(strict=False) pairs them alike.',
    'kernels.v4.cp_swa:prefill_cp_swa:boolop:ops or {}[Or]->And#0': 'The backends call a composing operator with their operator table (a dict): None never reaches it there.',
    'kernels.v4.cp_swa:project_tiles:drop-unary:-1[USub]->(none)#0': "normed is [T, D]: its last dim is dim 1, so the normalised rows' buffer has the same width.",
    "kernels.v4.cp_swa:project_tiles:drop-call:proj['kv'][:n].to(torch.bfloat16)[to]->(skipped)#0": 'v4_qkv_proj_rope returns kv in BF16 already.',
    'kernels.v4.cp_swa:project_tiles:name:bfloat16->float32#0': 'The staged rows are BF16 values: FP32 holds each exactly, and what reads them (the ring writes, the attention in FP64) sees the same numbers.',
    'kernels.v4.cp_swa:project_tiles:name:bfloat16->float32#1': 'The staged rows are BF16 values: FP32 holds each exactly, and what reads them (the ring writes, the attention in FP64) sees the same numbers.',
    'kernels.v4.cp_swa:attend_tiles:name:bfloat16->float32#1': 'The staged rows are BF16 values: FP32 holds each exactly, and what reads them (the ring writes, the attention in FP64) sees the same numbers.',
    'kernels.v4.cp_swa:attend_tiles:stage-dtype:bfloat16->float16#0': 'Neither path reads the compressed placeholder (SWA has no compressed slots; HCA hands its own cache): its dtype and shape are no part of any output.',
    'kernels.v4.cp_swa:attend_tiles:const:1->2#5': 'Neither path reads the compressed placeholder (SWA has no compressed slots; HCA hands its own cache): its dtype and shape are no part of any output.',
    'kernels.v4.cp_swa:attend_tiles:const:1->2#2': 'Neither path reads the compressed placeholder (SWA has no compressed slots; HCA hands its own cache): its dtype and shape are no part of any output.',
    'kernels.v4.cp_swa:attend_tiles:name:int32->int64#0': 'Neither path reads the compressed placeholder (SWA has no compressed slots; HCA hands its own cache): its dtype and shape are no part of any output.',
    'kernels.v4.cp_swa:attend_tiles:name:bfloat16->float32#0': 'Neither path reads the compressed placeholder (SWA has no compressed slots; HCA hands its own cache): its dtype and shape are no part of any output.',
    'kernels.v4.cp_swa:exchange_tails:const:2->3#0': 'A logical-tail table of 3cp segments: the rows past 2cp are never read (segments and predecessors are < 2cp).',
    'kernels.v4.cp_hca:cp_hca_plan:const:2->3#0': 'The per-segment lengths past 2cp are never read: every loop of the plan runs over the 2cp segments.',
    'kernels.v4.cp_hca:cp_hca_plan:drop-call:torch.clamp((qpos + 1) // RATIO, max=topk)[clamp]->(skipped)#0': 'The picks are the columns below the visible count, and the table is index_topk columns wide: a count past index_topk selects the same columns.',
    'kernels.v4.cp_hca:compress_segments:name:int64->int32#0': 'Positions, slots and state rows are far below 2^31: INT32 and INT64 index tensors give the compressor the same rows.',
    'kernels.v4.cp_hca:compress_segments:name:int64->int32#1': 'Positions, slots and state rows are far below 2^31: INT32 and INT64 index tensors give the compressor the same rows.',
    'kernels.v4.cp_hca:compress_segments:name:int64->int32#2': 'Positions, slots and state rows are far below 2^31: INT32 and INT64 index tensors give the compressor the same rows.',
    'kernels.v4.cp_hca:compress_segments:name:int64->int32#3': 'Positions, slots and state rows are far below 2^31: INT32 and INT64 index tensors give the compressor the same rows.',
    'kernels.v4.cp_hca:compress_segments:drop-call:qpos[rank, part, t, :counts[t]].to(torch.int64)[to]->(skipped)#0': 'Positions, slots and state rows are far below 2^31: INT32 and INT64 index tensors give the compressor the same rows.',
    'kernels.v4.cp_hca:compress_segments:drop-call:tail[:k].to(torch.int64)[to]->(skipped)#0': 'Positions, slots and state rows are far below 2^31: INT32 and INT64 index tensors give the compressor the same rows.',
    'kernels.v4.cp_hca:compress_segments:const:1->2#3': 'Only a closing position (p + 1 a multiple of 128) is listed, and there (p + 2) // 128 equals (p + 1) // 128.',
    'kernels.v4.cp_hca:compress_segments:const:1->2#6': 'The scratch publication pool only needs a row per closing window: a spare row is never read.',
    'kernels.v4.cp_hca:compress_segments:const:1->2#7': 'A scratch pool page of two rows: the publication and the read both address its rows flat, by the same index.',
    'kernels.v4.cp_hca:compress_segments:name:bfloat16->float32#0': "An FP32 scratch publication pool: the row is then rounded once to BF16 when copied into each rank's cache, the same single rounding.",
    'kernels.v4.cp_hca:compress_segments:const:1->2#9': 'Any negative compressed slot means no write (v4_publish_compressed skips slot < 0).',
    'kernels.v4.cp_hca:prefill_cp_hca:boolop:ops or {}[Or]->And#0': 'The backends call a composing operator with their operator table (a dict): None never reaches it there.',
    'kernels.v4.cp_csa:compress_segments:drop-call:qpos[rank, part, t, :counts[t]].to(torch.int64)[to]->(skipped)#0': 'Positions, slots and state rows are far below 2^31: INT32 and INT64 index tensors give the compressors the same rows.',
    'kernels.v4.cp_csa:compress_segments:name:int64->int32#0': 'Positions, slots and state rows are far below 2^31: INT32 and INT64 index tensors give the compressors the same rows.',
    'kernels.v4.cp_csa:compress_segments:name:int64->int32#1': 'Positions, slots and state rows are far below 2^31: INT32 and INT64 index tensors give the compressors the same rows.',
    'kernels.v4.cp_csa:compress_segments:name:int64->int32#2': 'Positions, slots and state rows are far below 2^31: INT32 and INT64 index tensors give the compressors the same rows.',
    'kernels.v4.cp_csa:compress_segments:drop-call:tail[:k].to(torch.int64)[to]->(skipped)#0': 'Positions, slots and state rows are far below 2^31: INT32 and INT64 index tensors give the compressors the same rows.',
    'kernels.v4.cp_csa:compress_segments:const:1->2#3': 'Only a closing position (p + 1 a multiple of 4) is listed, and there (p + 2) // 4 equals (p + 1) // 4.',
    'kernels.v4.cp_csa:compress_segments:const:1->2#6': 'Any negative slot means no write (the publications skip slot < 0).',
    'kernels.v4.cp_csa:compress_segments:const:1->2#7': "The scratch publication pool only has to hold a row per closing window, addressed flat: a spare row, a page of two rows or an FP32 row (rounded once into each rank's BF16 cache) changes no published byte.",
    'kernels.v4.cp_csa:compress_segments:const:1->2#8': "The scratch publication pool only has to hold a row per closing window, addressed flat: a spare row, a page of two rows or an FP32 row (rounded once into each rank's BF16 cache) changes no published byte.",
    'kernels.v4.cp_csa:compress_segments:name:bfloat16->float32#0': "The scratch publication pool only has to hold a row per closing window, addressed flat: a spare row, a page of two rows or an FP32 row (rounded once into each rank's BF16 cache) changes no published byte.",
    'kernels.v4.cp_csa:compress_segments:const:1->2#10': 'A segment holds at most 2R rows, so it closes at most 2R / 4 = 64 windows, fewer than one index page of the block size: the key pool has one block either way.',
    'kernels.v4.cp_csa:compress_segments:name:max->min#0': 'A segment holds at most 2R rows, so it closes at most 2R / 4 = 64 windows, fewer than one index page of the block size: the key pool has one block either way.',
    'kernels.v4.cp_csa:prefill_cp_csa:boolop:ops or {}[Or]->And#0': 'The backends call a composing operator with their operator table (a dict): None never reaches it there.',
    'kernels.v4.cp_csa:prefill_cp_csa:drop-call:freqs_cos[pos][:, :rope // 2].float()[float]->(skipped)#0': 'index_query converts the table rows to FP32 itself (row_cos.float()): BF16 rows reach it with the same values.',
    'kernels.v4.cp_csa:prefill_cp_csa:drop-call:freqs_sin[pos][:, :rope // 2].float()[float]->(skipped)#0': 'index_query converts the table rows to FP32 itself (row_sin.float()): BF16 rows reach it with the same values.',
    'kernels.v4.cp_csa:check_prefill_cp_csa:const:0->1#9': "The windows' first page: a start of 1 instead of 0 lies on the same page 0 (pages of 4 positions).",
    'kernels.v4.cp_csa:check_prefill_cp_csa:const:0->1#10': "The index keys' first page: slot 1 instead of 0 lies on the same page 0 (pages of the block size).",
    'kernels.v4.cp_layer:prefill_cp_layer:boolop:ops or {}[Or]->And#0': 'The backends call a composing operator with their operator table (a dict): None never reaches it there.',
    'kernels.v4.q_kv_split:v4_q_kv_split:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.attention_heads:v4_attention_heads:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.dspark_proj:dspark_proj:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.dspark_markov:dspark_markov_sample:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.dspark_markov:dspark_markov_sample:drop-call:anchor_token_ids.to(torch.int64)[to]->(skipped)#0': DSPARK_IDS,
    'kernels.v4.dspark_markov:dspark_markov_sample:name:int64->int32#0': DSPARK_IDS,
    'kernels.v4.dspark_markov:dspark_markov_sample:name:int64->int32#1': DSPARK_IDS,
    'kernels.v4.dspark_markov:dspark_markov_sample:drop-call:pick(scores).to(torch.int64)[to]->(skipped)#0': DSPARK_IDS,
    'kernels.v4.dspark_context_kv:check_dspark_context_kv:binop:kv_cache.numel() // dim[FloorDiv]->Div#0': DSPARK_ROWS_FLOAT,
    'kernels.v4.dspark_context_kv:dspark_context_kv:drop-call:position_ids.to(torch.int64)[to]->(skipped)#0': ROPE_CAST,
    'kernels.v4.dspark_context_kv:dspark_context_kv:name:int64->int32#0': ROPE_CAST,
    'kernels.v4.dspark_attention:visible_window:name:int32->int64#0': DTYPE,
    'kernels.v4.dspark_attention:visible_window:name:int32->int64#1': DTYPE,
    'kernels.v4.dspark_attention:visible_window:drop-call:swa_indices.to(torch.int32)[to]->(skipped)#0': DTYPE,
    'kernels.v4.dspark_attention:dspark_attention:drop-call:position_ids.to(torch.int64)[to]->(skipped)#0': ROPE_CAST,
    'kernels.v4.dspark_attention:dspark_attention:name:int64->int32#0': ROPE_CAST,
    "kernels.v4.dspark_attention:dspark_attention:drop-call:proj['kv'].to(kv_cache.dtype)[to]->(skipped)#0": CASTNOOP,
    'kernels.v4.dspark_attention:dspark_attention:const:1->2#0': V4_SWA_PLACEHOLDER,
    'kernels.v4.dspark_attention:dspark_attention:const:1->2#1': V4_SWA_PLACEHOLDER,
    'kernels.v4.dspark_attention:dspark_attention:const:1->2#4': V4_SWA_PLACEHOLDER,
    'kernels.v4.dspark_attention:dspark_attention:name:int32->int64#0': V4_SWA_PLACEHOLDER,
    'kernels.v4.dspark_attention:dspark_attention:const:False->True#0': V4_COMPOSES_DEFAULT,
    'kernels.v4.dspark_attention:dspark_attention:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.heads_projection:check_heads_projection:binop:h // groups[FloorDiv]->Div#0': DSPARK_ROWS_FLOAT,
    'kernels.v4.dspark_proj:projected_rows:drop-call:(main_hidden.double() @ main_proj_w.double().T).float()[float]->(skipped)#0': TORCH_F64,
    'kernels.v4.dspark_context_kv:check_dspark_context_kv:binop:rope // 2[FloorDiv]->Div#0': V4_EVEN_ROPE,
    'kernels.v4.dspark_attention:fp32_heads:name:amax->amin#0': DSPARK_SHIFT,
    'kernels.v4.dspark_attention:fp32_heads:name:maximum->minimum#0': DSPARK_SHIFT,
    'kernels.v4.dspark_attention:fp32_heads:drop-call:o.float()[float]->(skipped)#0': CASTNOOP,
    'kernels.v4.heads_projection:project_heads:drop-call:wo_b_scale.float()[float]->(skipped)#1': CASTNOOP,
    'kernels.v4.heads_projection:check_heads_projection_partial:binop:h // groups[FloorDiv]->Div#0': DSPARK_ROWS_FLOAT,
    'kernels.v4.heads_projection:v4_heads_projection_partial:drop-call:wo_b_scale.float()[float]->(skipped)#0': CASTNOOP,
    # kernels.v4.layer (v4_hca_stage, v4_decode_layer)
    'kernels.v4.layer:hca_limit:binop:config.max_position_embeddings // HCA_RATIO[FloorDiv]->Div#0': LAYER_LIMIT_DIV,
    'kernels.v4.layer:v4_hca_stage:binop:torch.arange(tokens) // seq[FloorDiv]->Div#0': LAYER_REQ_DIV,
    "kernels.v4.layer:v4_hca_stage:drop-call:a['freqs_cos'][:, :half].float()[float]->(skipped)#0": LAYER_ROPE_BF16,
    "kernels.v4.layer:v4_hca_stage:drop-call:a['freqs_sin'][:, :half].float()[float]->(skipped)#0": LAYER_ROPE_BF16,
    "kernels.v4.layer:v4_csa_stage:drop-call:a['freqs_cos'][:, :half].float()[float]->(skipped)#0": LAYER_ROPE_BF16,
    "kernels.v4.layer:v4_csa_stage:drop-call:a['freqs_sin'][:, :half].float()[float]->(skipped)#0": LAYER_ROPE_BF16,
    "kernels.v4.layer:v4_prefill_csa_stage:drop-call:cos[:, :rope // 2].float()[float]->(skipped)#0": LAYER_ROPE_BF16,
    "kernels.v4.layer:v4_prefill_csa_stage:drop-call:sin[:, :rope // 2].float()[float]->(skipped)#0": LAYER_ROPE_BF16,
    'kernels.v4.layer:v4_prefill_hca_stage:const:1->2#0': LAYER_LAST_PLUS,
    'kernels.v4.layer:v4_prefill_hca_stage:const:0->1#1': LAYER_NO_REAL_ROWS,
    "kernels.v4.layer:v4_prefill_hca_stage:drop-call:bound('hca_topk', hca_topk)(pos, torch.tensor([last]), se...[clone]->(skipped)#0": LAYER_FRESH_TOPK,
    'kernels.v4.layer:v4_prefill_hca_stage:const:1->2#1': LAYER_PADDING_SLOTS,
    'kernels.v4.layer:v4_prefill_hca_stage:drop-unary:-1[USub]->(none)#0': LAYER_PADDING_SLOTS,
    'kernels.v4.prefill_layer:check_v4_prefill_layer:const:True->False#0': ZIP,
    'kernels.v4.prefill_layer:_tile_rows:binop:tile - rows.shape[0][Sub]->Add#0': V4_TILE_PADDING,
    'kernels.v4.prefill_layer:_tile_rows:cmp:rows.shape[0] == tile[Eq]->NotEq#0': V4_TILE_PADDING,
    'kernels.v4.prefill_layer:_tile_rows:drop-call:rows.clone()[clone]->(skipped)#0': V4_TILE_PADDING,
    'kernels.v4.prefill_layer:v4_prefill_layer:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,

    # kernels.v4.dspark_drafter
    'kernels.v4.dspark_drafter:<module>:const:64->65#0': DRAFTER_LIST_PAD,
    'kernels.v4.dspark_drafter:drafter_plan:drop-unary:-1[USub]->(none)#1': DRAFTER_LIST_PAD,
    'kernels.v4.dspark_drafter:drafter_plan:const:1->2#3': DRAFTER_LIST_PAD,
    'kernels.v4.dspark_drafter:check_dspark_drafter:binop:last // page[FloorDiv]->Div#0': DRAFTER_LAST_DIV,
    'kernels.v4.dspark_drafter:dspark_drafter:boolop:ops or {}[Or]->And#0': V4_OPS_SAME,
    'kernels.v4.dspark_drafter:dspark_drafter:drop-call:main_x[rows - 1::rows].contiguous()[contiguous]->(skipped)#0': CONTIG,
    "kernels.v4.dspark_drafter:dspark_drafter:drop-call:rows_bf16.float()[:, None, :].expand(-1, config.hc_mult, ...[contiguous]->(skipped)#0": CONTIG,
    'kernels.v4.dspark_drafter:check_dspark_drafter:name:int64->int32#0': DTYPE,
    'kernels.v4.dspark_drafter:check_dspark_drafter:drop-call:anchor_positions.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.dspark_drafter:drafter_plan:drop-call:anchor_positions.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.dspark_drafter:drafter_plan:drop-call:block_tables.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.dspark_drafter:drafter_plan:name:int32->int64#0': DTYPE,
    'kernels.v4.dspark_drafter:drafter_plan:name:int32->int64#1': DTYPE,
    'kernels.v4.dspark_drafter:drafter_plan:name:int32->int64#2': DTYPE,
    'kernels.v4.dspark_drafter:drafter_plan:name:int32->int64#3': DTYPE,
    'kernels.v4.dspark_drafter:drafter_plan:name:int64->int32#0': DTYPE,
    'kernels.v4.dspark_drafter:drafter_plan:name:int64->int32#1': DTYPE,
    'kernels.v4.dspark_drafter:drafter_plan:drop-call:positions.to(torch.int32)[to]->(skipped)#0': DTYPE,
    'kernels.v4.dspark_drafter:query_ids:name:int64->int32#0': DTYPE,
    'kernels.v4.dspark_drafter:query_ids:name:int64->int32#1': DTYPE,
    'kernels.v4.dspark_drafter:query_ids:drop-call:anchor_token_ids.to(torch.int64)[to]->(skipped)#0': DTYPE,
    'kernels.v4.dspark_drafter:drafter_plan:drop-call:slot(layer, b, visible).to(torch.int32)[to]->(skipped)#0': CASTNOOP,
    # kernels.v4.dspark_metadata
    'kernels.v4.dspark_metadata:_check:const:True->False#0': ZIP,
    'kernels.v4.dspark_metadata:_lowered:const:True->False#0': ZIP,
    'kernels.v4.dspark_metadata:_check:binop:position_ids.numel() // seq[FloorDiv]->Div#0': INT_FLOAT,
    'kernels.metadata:paged_slots:boolop:vector.ndim != 1 or vector.dtype.is_floating_point or vec...[Or]->And#0': UNREACHABLE,  # refused by contracts/test_metadata_errors.py's direct call (MD-08)
    'kernels.metadata:paged_slots:boolop:block_table.ndim != 2 or block_table.dtype.is_floating_po...[Or]->And#0': UNREACHABLE,  # refused by contracts/test_metadata_errors.py's direct call (MD-08)
}
