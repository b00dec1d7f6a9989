/* `moetune plan RUN.yaml [--hw NAME|FILE|calibrate] [--json] [--trace FILE] [--set key=value]...`
 *
 * Plans a run from its config alone: base_model needs only config.json
 * (or base_model_init, a config.json file).  A LoRA run's base is counted
 * in its stored format (quantization_config, load_in_4bit), and with
 * memory.nvme.path the plan may use the NVMe tier (docs/planning.md).  Prints whether it fits and
 * why not; the predicted step time, tokens/s, model TFLOPS and MFU; peak
 * device, pinned and host memory against the budgets; the decisions per
 * block (runs of identical layers compressed) and per tensor kind; what
 * bounds the step; and the pinned staging each staging mode needs for the
 * plan's window, with host memory in total.  --trace writes the predicted step as a Chrome
 * trace (one track per stream, memory counters).
 *
 * The hardware profile: --hw, else the run config's `hardware:`; one of
 * them is required.  Budgets: memory.{device,pinned,host} from the run
 * config, else the profile's capacities.
 *
 * Exit codes: 0 a plan fits, 3 no plan fits the budgets (the output says
 * which budget is short and what would work), 1 an error, 2 a bad command
 * line.
 *
 * --json prints one document (schema "moetune.plan/1"; keys are only ever
 * added, never renamed).  Sizes in bytes, times in seconds, rates per second:
 *
 *   schema            "moetune.plan/1"
 *   run_config        path of RUN.yaml
 *   model             {model_type, config (path of config.json), layers, hidden, heads,
 *                      kv_heads, vocab, experts, top_k, params, active_params,
 *                      trainable_params}
 *   run               {micro_batch_size, sequence_len, gradient_accumulation_steps,
 *                      tokens_per_step, adapter ("none"|"lora"), lora_r,
 *                      bf16_working_copies, max_grad_norm}
 *   hardware          {name, source, device, link, host, matmul_flops_per_s (achievable),
 *                      peak_flops_per_s (MFU denominator), device_bytes_per_s,
 *                      h2d_bytes_per_s, d2h_bytes_per_s, host_bytes_per_s,
 *                      copy_latency_s}
 *   policy            "auto"|"keep_all"|"offload_all"|"min_memory"
 *   feasible          true|false
 *   reason            (infeasible only) the explanation printed in text mode
 *   short             (infeasible only) list of "device"|"pinned"|"host"
 *   needed_bytes      (infeasible only) {device?, pinned?, host?}: smallest budgets that work
 *   prediction        {step_time_s, tokens_per_s, model_flops, model_tflops, mfu,
 *                      compute_busy_s, compute_idle_s, recompute_s, bound_by
 *                      ("compute"|"h2d"|"d2h"|"host optimizer"|"nvme"),
 *                      busy_s {compute, h2d, d2h, host, nvme}, waited_s {compute, h2d, d2h, host, nvme},
 *                      h2d_bytes, d2h_bytes}
 *                      (for an infeasible run: the numbers of the plan the reason refers to)
 *   memory            {device, pinned, host}: each {peak_bytes, budget_bytes, static_bytes}
 *   plan              {prefetch_window,
 *                      blocks [{block, name, weights ("resident"|"stream"), grads
 *                               ("device"|"host"), optimizer ("device"|"host"),
 *                               activations ("keep"|"offload"|"recompute"),
 *                               nvme_optimizer, nvme_weights (true: on the NVMe tier),
 *                               pinned_home, pinned_grads (true: trained working copies / host
 *                               gradient accumulators pinned)}],
 *                      runs [{first, last, label, weights, grads, optimizer, activations}]}
 *   kinds             {weights {resident_blocks, stream_blocks, resident_bytes, fetched_bytes},
 *                      grads {device_blocks, host_blocks, d2h_bytes},
 *                      optimizer {device_blocks, host_blocks, device_bytes, host_bytes},
 *                      activations {keep_blocks, offload_blocks, recompute_blocks}}
 *   staging           pinned staging per mode of moe/staging for the plan's in-flight window
 *                     (prefetch_window + 1 streamed blocks, one block of host gradients, offloaded
 *                     activations): {window_blocks, hypothetical (the plan stages nothing: shown for
 *                     streamed layers), tensors, payload_bytes, weights_bytes, grads_bytes, acts_bytes,
 *                     largest_tensor_bytes, compact_bytes, per_tensor_bytes, per_tensor_pow2_bytes,
 *                     max_slot_bytes, max_slot_slots, host_total_bytes {compact, per_tensor, max_slot}
 *                     (pageable peak + that mode's staging)}
 *   nvme              (with memory.nvme.path) the third tier: {read_bytes, write_bytes (per step),
 *                     busy_s, bytes (capacity used), budget_bytes (0: none), read_bytes_per_s,
 *                     write_bytes_per_s, optimizer_blocks, weights_blocks, optimizer_bytes,
 *                     weights_bytes}
 *   base_quant        (a LoRA run's frozen base kept quantized) {format ("fp8"|"mxfp4"|"nf4"|"fp4"),
 *                     block, double_quant, experts_only, stored_bytes, working_dtype_bytes}
 *   data_parallel     (with --devices N > 1 or devices: in the run config) data parallel on N
 *                     devices of one host sharing one host copy, each device's share planned and
 *                     simulated over its own link (scheduler/data_parallel.h): {devices, feasible,
 *                     micro_batches_per_device, fwd_bwd_s, reduce_s, optim_s, refresh_s,
 *                     step_time_s, tokens_per_s (all devices), single_device_step_time_s,
 *                     reduce_device_bytes, reduce_host_bytes, per_device [{device, h2d_bytes,
 *                     d2h_bytes, peak_device_bytes}], h2d_bytes_total, peer_bytes (rows each device
 *                     sends the other per step; through host memory also in the link bytes)}; the
 *                     layout the run uses.  With 2 devices also: parallel ("auto"|"data"|"expert",
 *                     asked), layout ("data"|"mix"|"expert", used), peer_via_host, layouts {data, mix,
 *                     expert: each null (no MoE layers) or {feasible, step_time_s, tokens_per_s,
 *                     expert_parallel_layers, peer_bytes, reduce_device_bytes, per_device [{device,
 *                     h2d_bytes, d2h_bytes, peak_device_bytes}]}}, moe_layers [{block, layer,
 *                     expert_parallel}] (the used plan's choice per MoE layer)
 */
#ifndef MT_TOOLS_PLAN_PLAN_CMD_H
#define MT_TOOLS_PLAN_PLAN_CMD_H

/* argv[0] is the command's name ("plan"); output goes to stdout, errors to stderr. */
int mt_plan_main(int argc, char **argv);

#endif
