(* Evolves populations on three fitness landscapes with the GA functor. Arguments:
   population size, generations. *)

let dims = 12

(* real vectors on the Rastrigin function, minimum 0 at the origin *)
module Rastrigin = struct
  type genome = float array
  let name = "rastrigin"
  let random rng = Array.init dims (fun _ -> (Rng.float rng *. 10.24) -. 5.12)
  let crossover rng a b =
    let w = Rng.float rng in
    Array.init dims (fun i -> (w *. a.(i)) +. ((1. -. w) *. b.(i)))
  let mutate rng g =
    Array.map (fun x -> if Rng.int rng dims = 0 then x +. (0.3 *. Rng.gaussian rng) else x) g
  let fitness g =
    Array.fold_left
      (fun s x -> s +. (x *. x) -. (10. *. cos (2. *. Float.pi *. x)) +. 10.)
      0. g
end

(* Rosenbrock's valley in the same number of dimensions, minimum 0 at (1, ..., 1) *)
module Rosenbrock = struct
  include Rastrigin
  let name = "rosenbrock"
  let fitness g =
    let s = ref 0. in
    for i = 0 to dims - 2 do
      let a = g.(i + 1) -. (g.(i) *. g.(i)) and b = 1. -. g.(i) in
      s := !s +. (100. *. a *. a) +. (b *. b)
    done;
    !s
end

(* bit strings made of deceptive 4-bit traps: a block scores best when all ones, but
   the slope leads towards all zeros *)
module Trap = struct
  type genome = Bytes.t
  let len = 64
  let name = "trap"
  let random rng = Bytes.init len (fun _ -> if Rng.bool rng then '1' else '0')
  let crossover rng a b =
    let cut = Rng.int rng len in
    Bytes.init len (fun i -> if i < cut then Bytes.get a i else Bytes.get b i)
  let mutate rng g =
    Bytes.map (fun c -> if Rng.int rng len = 0 then (if c = '1' then '0' else '1') else c) g
  let fitness g =
    let s = ref 0 in
    for blk = 0 to (len / 4) - 1 do
      let ones = ref 0 in
      for i = 4 * blk to (4 * blk) + 3 do if Bytes.get g i = '1' then incr ones done;
      s := !s + (if !ones = 4 then 0 else 1 + !ones)
    done;
    float !s
end

let problems : (module Ga.PROBLEM) list = [ (module Rastrigin); (module Rosenbrock); (module Trap) ]

let () =
  let pop = if Array.length Sys.argv > 1 then int_of_string Sys.argv.(1) else 100 in
  let generations = if Array.length Sys.argv > 2 then int_of_string Sys.argv.(2) else 50 in
  let prm = { Ga.pop; generations; tournament = 3; elite = 2 } in
  List.iteri
    (fun k (module P : Ga.PROBLEM) ->
      let module E = Ga.Make (P) in
      let rng = Rng.make (1000 + k) in
      let best, mean = E.run rng prm in
      Printf.printf "%-10s best %.6f mean %.4f\n" P.name best.E.fit mean)
    problems;
  let r = Rng.make 7 in
  let draws = Array.init 5 (fun _ -> Rng.int r 1000) in
  Printf.printf "pop %d generations %d rng check %s\n" pop generations
    (String.concat " " (Array.to_list (Array.map string_of_int draws)))
