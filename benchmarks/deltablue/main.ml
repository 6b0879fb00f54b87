(* The two classic DeltaBlue workloads: a chain of equalities edited at one end, and a
   projection of many variables through scale constraints edited from both sides. *)

open Constr

let errors = ref 0
let check cond = if not cond then incr errors

let chain n =
  let vs = Array.init (n + 1) (fun i -> var (Printf.sprintf "v%d" i) 0) in
  for i = 0 to n - 1 do ignore (Planner.add (Equal (vs.(i), vs.(i + 1))) Strength.Required) done;
  ignore (Planner.add (Stay vs.(n)) Strength.Strong_default);
  let edit = Planner.add (Edit vs.(0)) Strength.Preferred in
  let plan = Planner.extract_plan [ edit ] in
  let sum = ref 0 in
  for i = 0 to 99 do
    vs.(0).value <- i;
    Planner.run_plan plan;
    check (vs.(n).value = i);
    sum := !sum + vs.(n).value + vs.(n / 2).value
  done;
  Planner.destroy edit;
  (List.length plan, !sum)

let change v value =
  let edit = Planner.add (Edit v) Strength.Preferred in
  let plan = Planner.extract_plan [ edit ] in
  for _ = 1 to 10 do v.value <- value; Planner.run_plan plan done;
  Planner.destroy edit

let projection n =
  let scale = var "scale" 10 and offset = var "offset" 1000 in
  let src = ref scale and dst = ref scale in
  let dests = Array.init n (fun i ->
      src := var "src" i;
      dst := var "dst" i;
      ignore (Planner.add (Stay !src) Strength.Normal);
      ignore (Planner.add (Scale { src = !src; scale; offset; dst = !dst }) Strength.Required);
      !dst) in
  change !src 17;
  check (!dst.value = 1170);
  change !dst 1050;
  check (!src.value = 5);
  (* the last source was edited to 5 above, so its destination is skipped *)
  change scale 5;
  Array.iteri (fun i d -> if i < n - 1 then check (d.value = (i * 5) + 1000)) dests;
  change offset 2000;
  Array.iteri (fun i d -> if i < n - 1 then check (d.value = (i * 5) + 2000)) dests;
  Array.fold_left (fun s d -> s + d.value) 0 dests

let () =
  let n = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 100 in
  let rounds = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 1 in
  let plan_len = ref 0 and csum = ref 0 and psum = ref 0 in
  for _ = 1 to rounds do
    let l, s = chain n in
    plan_len := l;
    csum := !csum + s;
    psum := !psum + projection n
  done;
  Printf.printf "deltablue n %d rounds %d\n" n rounds;
  Printf.printf "chain plan length %d, checksum %d\n" !plan_len !csum;
  Printf.printf "projection checksum %d\n" !psum;
  Printf.printf "failed checks %d, marks used %d\n" !errors !Planner.current_mark
